"""Serving: a trained checkpoint as a TensorFlow SavedModel that loads without des
(``docs/design.md``, section 11). ``state.py`` reads what the model holds from a checkpoint,
``model.py`` builds its TF graph (the key transforms' and the initializer's TF twins live beside
their numpy sides: ``des/data/features.py``, ``des/hashtable/tf_init.py``); ``des.export`` is the
command line that writes and publishes it."""
