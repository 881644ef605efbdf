"""The in-cluster actuator: Prometheus + Kubernetes in, policy decisions, Kubernetes moves out.

See docs/actuator.md. Observe (`observe`, `kube`) -> `state_builder` -> `guardrails` (pure
decide) -> `apply`, run by `loop`; `twin/` is the digital twin used for demos and tests.
"""
