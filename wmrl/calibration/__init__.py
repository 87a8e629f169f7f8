"""The shared calibration: state, stores, HTTP service, client and benchmark.

``state`` is pure (numpy); ``store`` needs the kubernetes client only for
:class:`~wmrl.calibration.store.ConfigMapStore`; ``service`` needs aiohttp.
Nothing here is imported eagerly.
"""

TOKEN_ENV = "WMRL_CALIBRATION_TOKEN"
"""The shared secret a trainer presents to add observations (the operator fills it from the calibration's Secret)."""
