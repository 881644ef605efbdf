"""The digital twin: the simulator presented as a cluster (Prometheus exporters + Kubernetes API).

`rlalloc twin` runs it for demos; the actuator's end-to-end tests run the actuator against it.
Unlike the actuator itself, the twin may use the simulator (env.simulator, env.scenario).
"""
