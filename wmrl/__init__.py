"""wmrl: World Model RL for AutoResearch agents, Kubernetes-native.

The ``wmrl`` import package is the shared core: the WMRLRun schema, the outcome
schema and reward ladder, the debiasing/denoising math and the calibration
service. The operator (``wmrl_operator``), trainer (``wmrl_trainer``) and sandbox
server (``wmrl_sandbox``) import it; it imports none of them.
"""

__version__ = "0.1.0"
