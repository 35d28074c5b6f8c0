"""How the bot learns from its users, gathered in one place as it moves here: lessons (:mod:`.lessons`, what a
correction teaches; :mod:`.lesson_finder`, which replies teach one; :mod:`.lesson_checks`, verification and
retirement). The judge, trainer loop, hindsight demonstrations, loop probe, collapse guard, promotion gate and
algorithms still live at the package's top level (``judge.py``, ``trainer_loop.py``, ...)."""
