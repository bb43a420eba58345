"""The image path's trainer: a small classifier (:mod:`.model`) trained on image shards through DALI
(:mod:`.train`, ``python -m trainer.vision.train``)."""
