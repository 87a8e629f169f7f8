"""End-to-end benchmarks of the method on this machine (``wmrl bench speedup``, ``wmrl bench
quickstart``, ``wmrl report``): they drive the trainer; the trainer never imports them."""
