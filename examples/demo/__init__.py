"""``make demo``: the whole job on real bundled text (corpus, preprocessing, HTTP storage, training, report, export)."""
