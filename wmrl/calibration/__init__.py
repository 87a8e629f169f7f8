"""The shared calibration: state, stores, HTTP service, client and benchmark.

``state`` is pure (numpy); ``store`` needs the kubernetes client only for
:class:`~wmrl.calibration.store.ConfigMapStore`; ``service`` needs aiohttp.
Nothing here is imported eagerly.
"""
