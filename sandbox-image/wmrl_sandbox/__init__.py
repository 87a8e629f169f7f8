"""The sandbox execution server (SandboxFusion-compatible ``/run_code``) and its client."""
