"""Experiment trackers (``train.report_to``): TensorBoard, Weights & Biases, MLflow and trackio get what the store
holds, without ever holding up serving or training.

- :mod:`.scalars`: the documented metric names, read out of a ``steps`` row or an ``openclaw eval`` report.
- :mod:`.trackers`: one adapter per tracker, each over the tracker's own library (an optional extra).
- :mod:`.hub`: a daemon thread that opens the trackers and sends them rows, from the store (``openclaw launch``:
  per-tracker cursors in the store, so a restart resumes the same run and sends each row once) or pushed by the
  caller (``openclaw train --env``). A tracker that cannot open or send is logged once and left behind; the
  store keeps everything, and a tracker that recovers catches up from its cursor.
"""
