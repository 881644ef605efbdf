"""Metric names shared by the simulator's telemetry, the trainer jobs' exporter and the actuator.

One module so the three never drift apart: the simulator exports its telemetry under these
names (`rlalloc twin`), the training jobs export theirs (`trainer_jobs`), and the actuator
queries them from Prometheus. Everything here is a plain string; the module imports nothing.

The DCGM and kube-state-metrics names are the real exporters' names; the trainer names are ours.
"""

# --- NVIDIA dcgm-exporter (per GPU; labels: Hostname, gpu, UUID) ---------------------------
DCGM_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
"""GPU utilisation in percent (0-100)."""
DCGM_XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"
"""Value of the last XID error seen; detect new errors with `changes(...[5m])`."""
DCGM_GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"
"""GPU temperature in degrees Celsius."""
DCGM_ECC_DBE_VOLATILE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
"""Double-bit (uncorrectable) ECC errors since the driver loaded (a counter)."""
DCGM_ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
"""1 when HBM row remapping failed on the GPU: the GPU should be drained."""
DCGM_HOSTNAME_LABEL = "Hostname"
"""dcgm-exporter's label carrying the Kubernetes node name."""

# --- kube-state-metrics ----------------------------------------------------------------------
KSM_NODE_CONDITION = "kube_node_status_condition"
"""Labels: node, condition (Ready, ...), status (true/false/unknown); 1 for the current one."""
KSM_NODE_UNSCHEDULABLE = "kube_node_spec_unschedulable"
"""1 when the node is cordoned."""
KSM_POD_PHASE = "kube_pod_status_phase"
"""Labels: namespace, pod, phase; value 1 for the pod's current phase."""

# --- rlalloc trainer jobs (labels: job = PyTorchJob name, namespace, rank) ----------------
TRAINER_SAMPLES_PER_S = "rlalloc_trainer_samples_per_second"
"""Training throughput of the whole job, samples per second, averaged over recent steps."""
TRAINER_STEP = "rlalloc_trainer_step"
"""Optimizer steps completed (continues across restarts)."""
TRAINER_TOTAL_STEPS = "rlalloc_trainer_total_steps"
"""Steps the job is configured to run; step / total_steps is the job's progress."""
TRAINER_WORLD_SIZE = "rlalloc_trainer_world_size"
"""Number of workers in the current rendezvous."""
TRAINER_LOSS = "rlalloc_trainer_loss"
"""Training loss of the latest step."""
TRAINER_LAST_CHECKPOINT_TIME = "rlalloc_trainer_last_checkpoint_timestamp_seconds"
"""Unix time of the latest complete checkpoint's commit, or of the trainer's (re)start if later:
from then on its training is at risk (a restart counts as a checkpoint, as in the simulator)."""
TRAINER_LAST_CHECKPOINT_STEP = "rlalloc_trainer_last_checkpoint_step"
"""Step stored in the latest complete checkpoint."""
TRAINER_CHECKPOINT_DURATION = "rlalloc_trainer_checkpoint_duration_seconds"
"""Seconds the training loop was blocked by the latest checkpoint."""

# --- rlalloc's Kubernetes conventions ----------------------------------------------------------
MANAGED_LABEL = "rlalloc.io/managed"
"""Label a PyTorchJob carries (value "true") to let rlalloc scale, place and move it."""
APPLICATION_LABEL = "rlalloc.io/application"
"""Optional label naming the job's model (bert, cifar10, ...) to pick its throughput profile."""
