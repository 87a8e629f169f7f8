"""Demo-scale pieces that let wmrl learn on a CPU with nothing downloaded.

``builtin:tiny-coder`` (the policy: :mod:`.demo_policy`, its grammar-carrying network
:mod:`.tiny_coder_model`, its action space of code chunks :mod:`.solutions`) and the
``mini-ml`` task suite (:mod:`.suite`, :mod:`.suite_data`). The trainer loads them only when
a spec names ``builtin:...``; production runs never import this package.
"""
