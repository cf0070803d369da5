"""ridgescope where training already runs: one module per framework, each a thin adapter over
``rs.track`` driven by the framework's public callback API (docs/integrations.md).

* ``ridgescope.integrations.transformers.RidgescopeCallback``: Hugging Face ``Trainer``
  (``pip install 'ridgescope[transformers]'``).
* ``ridgescope.integrations.lightning.RidgescopeCallback``: Lightning's ``Trainer``, from the
  ``lightning`` or the ``pytorch_lightning`` package (``pip install 'ridgescope[lightning]'``).
* ``pytest_ridgescope`` (a module beside the package, python/pytest_ridgescope.py): the pytest
  plugin (``@pytest.mark.ridgescope(...)`` and the ``ridgescope_session`` fixture), registered
  through the ``pytest11`` entry point.

Importing ``ridgescope`` (or this package) imports none of these frameworks; each module
imports its framework when it is itself imported."""
