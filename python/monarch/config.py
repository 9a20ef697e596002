"""`monarch.config` on xmesh: Monarch's configuration layer (`configure`, `configured`,
`get_runtime_config`, ...), so programs and tests that set it run unchanged.

Monarch's keys tune its Rust runtime (hyperactor's channels, acks, encodings, timeouts). xmesh has
its own knobs (README "Configuration": the XMESH_* variables), and none of Monarch's keys changes
what xmesh does: configure() checks each key is one of Monarch's (ValueError otherwise, as in
Monarch), keeps the value in the runtime layer that get_runtime_config() shows and configured()
restores, and warns once per key that xmesh does not act on it (never a silent difference)."""
import contextlib
import warnings
from typing import Any, Dict, Iterator

__all__ = ["clear_runtime_config", "configure", "configured", "get_global_config", "get_runtime_config"]

# Monarch 0.7's configuration keys (monarch.config.configure's documented arguments).
MONARCH_KEYS = frozenset("""
default_transport enable_log_forwarding enable_file_capture tail_log_lines codec_max_frame_length
message_delivery_timeout host_spawn_ready_timeout mesh_proc_spawn_max_idle process_exit_timeout
message_ack_time_interval message_ack_every_n_messages message_ttl_default split_max_buffer_size
split_max_buffer_age stop_actor_timeout cleanup_timeout default_encoding
channel_net_rx_buffer_full_check_interval channel_tcp_congestion message_latency_sampling_rate
enable_dest_actor_reordering_buffer mesh_bootstrap_enable_pdeathsig mesh_terminate_concurrency
mesh_terminate_timeout small_write_threshold max_cast_dimension_size remote_alloc_bind_to_inaddr_any
remote_alloc_bootstrap_addr remote_alloc_allowed_port_range read_log_buffer force_file_log prefix_with_rank
actor_spawn_max_idle get_actor_state_max_idle supervision_watchdog_timeout proc_stop_max_idle
get_proc_state_max_idle mesh_admin_addr mesh_attach_config_timeout rdma_allow_tcp_fallback
rdma_disable_ibverbs rdma_max_chunk_size_mb rdma_ibverbs_target rdma_peer_device_affinity
rdma_runtime_worker_threads mesh_orphan_timeout
""".split())

_runtime_layer: Dict[str, Any] = {}
_warned: set = set()


def configure(**kwargs: Any) -> None:
    """Sets Monarch configuration keys in this process's runtime layer. A key that is not one of
    Monarch's raises ValueError naming it; xmesh acts on none of them (a warning says so, once
    per key): its own settings are the XMESH_* variables."""
    unknown = sorted(k for k in kwargs if k not in MONARCH_KEYS)
    if unknown:
        raise ValueError(f"monarch.config.configure(): unknown configuration key(s) {', '.join(unknown)} "
                         f"(Monarch's keys: {', '.join(sorted(MONARCH_KEYS))})")
    for key, value in kwargs.items():
        if key not in _warned:
            _warned.add(key)
            warnings.warn(f"monarch.config: {key} tunes Monarch's own runtime; xmesh keeps the value but does not act "
                          "on it (xmesh's settings are the XMESH_* variables, README \"Configuration\")", stacklevel=2)
        _runtime_layer[key] = value


def get_runtime_config() -> Dict[str, Any]:
    """The keys set through configure() (a copy)."""
    return dict(_runtime_layer)


def get_global_config() -> Dict[str, Any]:
    """Monarch merges defaults, environment, files and the runtime layer; xmesh has only the
    runtime layer (its own settings are environment variables), so this is that layer."""
    return dict(_runtime_layer)


def clear_runtime_config() -> None:
    _runtime_layer.clear()


@contextlib.contextmanager
def configured(**overrides: Any) -> Iterator[Dict[str, Any]]:
    """configure(**overrides) for the duration of the block, then the previous layer again."""
    saved = dict(_runtime_layer)
    try:
        configure(**overrides)
        yield get_global_config()
    finally:
        _runtime_layer.clear()
        _runtime_layer.update(saved)
