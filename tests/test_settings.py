"""Settings: precedence of the four layers, where each value came from, validation messages, secret masking."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import SecretStr

from openclaw_cli.settings import (
    SettingsError,
    effective_items,
    effective_values,
    load_settings,
    mask_secret,
    parse_overrides,
    resolve_config_path,
    settings_sources,
)

SECRET = "tml-secret123456789"


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No OPENCLAW_* / provider key from the developer's shell, and a cwd without an openclaw.toml."""
    for name in list(os.environ):
        if name.startswith("OPENCLAW_") or name in ("TINKER_API_KEY", "FIREWORKS_API_KEY", "FIREWORKS_ACCOUNT_ID"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write_toml(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_each_layer_beats_the_one_below_for_top_level_and_nested_keys(monkeypatch, tmp_path):
    toml = write_toml(tmp_path / "c.toml", "port = 8401\n[judge]\nvotes = 4\n")
    cli = {"port": 8403, "judge": {"votes": "6"}}

    defaults = load_settings()
    assert (defaults.port, defaults.judge.votes) == (8400, 3)

    from_file = load_settings(config=toml)
    assert (from_file.port, from_file.judge.votes) == (8401, 4)

    monkeypatch.setenv("OPENCLAW_PORT", "8402")
    monkeypatch.setenv("OPENCLAW_JUDGE__VOTES", "5")
    from_env = load_settings(config=toml)
    assert (from_env.port, from_env.judge.votes) == (8402, 5)

    from_cli = load_settings(cli, config=toml)
    assert (from_cli.port, from_cli.judge.votes) == (8403, 6)


def test_sources_name_the_winning_layer_per_key(monkeypatch, tmp_path):
    toml = write_toml(tmp_path / "c.toml", 'port = 8401\nmethod = "opd"\n[judge]\nvotes = 4\ntemperature = 0.2\n')
    monkeypatch.setenv("OPENCLAW_JUDGE__VOTES", "5")
    monkeypatch.setenv("OPENCLAW_METHOD", "combined")
    overrides = {"port": 8403}

    sources = settings_sources(overrides, config=toml)
    settings = load_settings(overrides, config=toml)
    rows = {key: (value, source) for key, value, source in effective_items(settings, sources)}

    assert rows["port"] == ("8403", "cli")
    assert rows["method"] == ("combined", "env")
    assert rows["judge.votes"] == ("5", "env")
    # The env var for judge.votes must not hide the file's value for a sibling key of the same section.
    assert rows["judge.temperature"] == ("0.2", str(toml))
    assert rows["host"] == ("127.0.0.1", "default")


def test_openclaw_toml_in_the_working_directory_is_read_without_flags(tmp_path):
    write_toml(tmp_path / "openclaw.toml", 'backend = "tinker"\n')
    assert resolve_config_path(None) == tmp_path / "openclaw.toml"
    assert load_settings().backend == "tinker"


def test_explicit_config_that_does_not_exist_is_an_error(tmp_path):
    with pytest.raises(SettingsError, match="config file not found"):
        load_settings(config=tmp_path / "missing.toml")


def test_parse_overrides_builds_nested_dicts_and_reads_json_lists():
    parsed = parse_overrides(["judge.votes=5", "model=org/name=v2", 'lora.targets=["q_proj", "v_proj"]'])
    assert parsed == {"judge": {"votes": "5"}, "model": "org/name=v2", "lora": {"targets": ["q_proj", "v_proj"]}}
    assert load_settings(parsed).lora.targets == ["q_proj", "v_proj"]


@pytest.mark.parametrize("pair", ["judge.votes", "=5", "lora.targets=[q_proj"])
def test_parse_overrides_rejects_malformed_pairs(pair):
    with pytest.raises(SettingsError, match="--set"):
        parse_overrides([pair])


def test_invalid_choice_names_key_and_allowed_values():
    with pytest.raises(SettingsError) as info:
        load_settings({"method": "foo"})
    message = str(info.value)
    assert message.count("\n") == 0
    assert "method" in message and "'rl', 'opd' or 'combined'" in message and "'foo'" in message


def test_out_of_range_number_names_the_full_allowed_range():
    with pytest.raises(SettingsError) as info:
        load_settings({"judge": {"votes": "0"}})
    assert str(info.value) == (
        "invalid setting judge.votes: Input should be greater than or equal to 1; allowed: >= 1 and <= 15 (got '0')"
    )


def test_unknown_key_suggests_the_close_match_and_lists_known_keys():
    with pytest.raises(SettingsError) as info:
        load_settings({"judge": {"vote": "1"}})
    message = str(info.value)
    assert message.startswith("invalid setting judge.vote: unknown setting; did you mean votes?")
    assert (
        "known keys in judge: model, base_url, api_key, client, mode, margin, hint_source, next_state_hints, votes, "
        "temperature, max_concurrency" in message
    )


def test_several_problems_give_one_line_each():
    with pytest.raises(SettingsError) as info:
        load_settings({"method": "foo", "port": "0", "bogus": "1"})
    lines = str(info.value).splitlines()
    assert len(lines) == 3
    assert {line.split(":")[0] for line in lines} == {
        "invalid setting method",
        "invalid setting port",
        "invalid setting bogus",
    }


def test_a_secret_of_the_wrong_type_is_never_echoed(tmp_path):
    toml = write_toml(tmp_path / "c.toml", "api_key = 123456789\n[tinker]\napi_key = 987654321\n")
    with pytest.raises(SettingsError) as info:
        load_settings(config=toml)
    message = str(info.value)
    assert "api_key" in message
    assert "123456789" not in message and "987654321" not in message


def test_a_section_given_a_string_does_not_echo_it():
    with pytest.raises(SettingsError) as info:
        load_settings({"tinker": SECRET})
    assert "tinker" in str(info.value) and "secret" not in str(info.value)


def test_undecodable_env_value_gives_a_clear_line_without_the_value(monkeypatch):
    monkeypatch.setenv("OPENCLAW_LORA__TARGETS", "q_proj,v_proj")
    with pytest.raises(SettingsError) as info:
        load_settings()
    message = str(info.value)
    assert "lora" in message and "JSON" in message and "None" not in message and "q_proj,v_proj" not in message


def test_malformed_toml_names_the_file(tmp_path):
    toml = write_toml(tmp_path / "c.toml", "port = \n")
    with pytest.raises(SettingsError, match=r"cannot read config file .*c\.toml"):
        load_settings(config=toml)


def test_secrets_are_masked_in_every_rendering(monkeypatch):
    monkeypatch.setenv("OPENCLAW_TINKER__API_KEY", SECRET)
    settings = load_settings()
    assert settings.tinker.api_key is not None and settings.tinker.api_key.get_secret_value() == SECRET
    shown = dict((key, value) for key, value, _ in effective_items(settings, settings_sources()))
    values = effective_values(settings)
    assert shown["tinker.api_key"] == "**** (set)"
    assert values["tinker.api_key"] == "**** (set)"
    assert values["api_key"] is None  # unset secrets are plain null in JSON
    assert SECRET[4:10] not in repr(shown) + repr(values) + repr(settings)


def test_mask_secret_reveals_nothing_of_the_value():
    assert mask_secret(None) == "(unset)"
    assert mask_secret(SecretStr("")) == "(empty)"
    assert mask_secret(SecretStr(SECRET)) == mask_secret(SecretStr("sk-other"))


def test_effective_values_are_typed_for_json():
    values = effective_values(load_settings({"port": "9001"}))
    assert values["port"] == 9001
    assert values["judge.temperature"] == 0.6
    assert values["store.path"] == ".openclaw/store.sqlite3"
    assert values["lora.targets"][:2] == ["q_proj", "k_proj"]
    assert values["model"] is None


def test_a_third_party_backend_reads_its_own_typed_section(monkeypatch, tmp_path):
    from pydantic import BaseModel

    from openclaw_cli.backend import plugin_settings

    class AcmeSettings(BaseModel):
        model_config = {"extra": "forbid"}
        region: str = "eu"
        replicas: int = 1
        api_key: SecretStr | None = None

    config = tmp_path / "openclaw.toml"
    config.write_text('[plugins.acme]\nregion = "us"\napi_key = "sk-acme-123456"\n')
    monkeypatch.setenv("OPENCLAW_PLUGINS__ACME__REPLICAS", "3")
    settings = load_settings(parse_overrides(["plugins.acme.region=ap"]), config=config)
    acme = plugin_settings(settings, "acme", AcmeSettings)
    assert (acme.region, acme.replicas, acme.api_key.get_secret_value()) == ("ap", 3, "sk-acme-123456")
    assert plugin_settings(settings, "other", AcmeSettings).region == "eu"  # no section: the model's defaults
    # Shown everywhere with the secret-looking key masked, never the key itself.
    shown = effective_values(settings)
    assert shown["plugins.acme.api_key"] == "**** (set)" and shown["plugins.acme.region"] == "ap"
    rendered = str(effective_items(settings, {}))
    assert "sk-acme" not in rendered and "**** (set)" in rendered

    bad = load_settings(parse_overrides(["plugins.acme.replicas=many", "plugins.acme.colour=red"]))
    with pytest.raises(SettingsError) as info:
        plugin_settings(bad, "acme", AcmeSettings)
    assert "plugins.acme.replicas" in str(info.value) and "plugins.acme.colour" in str(info.value)
    assert "many" not in str(info.value)  # the value itself is not echoed


def test_config_show_renderings_list_the_same_keys_with_and_without_a_plugin_section(tmp_path):
    config = write_toml(tmp_path / "plugins.toml", "[plugins.acme]\nreplicas = 3\n[plugins.acme.limits]\nrpm = 60\n")
    with_plugin = load_settings(parse_overrides(["plugins.acme.region=us", "plugins.acme.token=x"]), config=config)
    for settings in (load_settings(), with_plugin):
        rows = effective_items(settings, {})
        assert [key for key, _, _ in rows] == list(effective_values(settings))
        assert all(isinstance(shown, str) for _, shown, _ in rows)  # the table renders text only
    shown = {key: value for key, value, _ in effective_items(with_plugin, {})}
    assert shown["plugins.acme.limits.rpm"] == "60" and shown["plugins.acme.token"] == "**** (set)"
