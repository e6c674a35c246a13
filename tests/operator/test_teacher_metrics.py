"""A shared teacher replica's load from vLLM's Prometheus text (`parse_replica_sample`, `replica_load`, as
the operator's scaler reads it): the colon-named gauges, summed over their series; a page without them is
refused rather than read as idle."""

from __future__ import annotations

import pytest
from distillery_operator.teachers.metrics import ReplicaSample, parse_replica_sample, replica_load

from distillery.plan.teachers.scaling import ReplicaLoad

VLLM_PAGE = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 1234.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="teacher"} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="teacher"} 12.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="teacher"} 0.42
"""


def load_now(page: str) -> ReplicaLoad:
    """The load of a first read (no previous one to take our queue's mean over)."""
    return replica_load(parse_replica_sample(page), None, 0.0)


def test_the_waiting_and_running_gauges_of_a_vllm_page() -> None:
    assert parse_replica_sample(VLLM_PAGE) == ReplicaSample(
        waiting=12, running=7, queued=0, waited_seconds=None
    )
    assert load_now(VLLM_PAGE) == ReplicaLoad(waiting=12, running=7)


def test_several_series_of_a_gauge_are_summed() -> None:
    page = (
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="a"} 2\n'
        'vllm:num_requests_waiting{engine="1",model_name="a"} 3\n'
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="a"} 1\n'
        'vllm:num_requests_running{engine="1",model_name="a"} 4\n'
    )
    assert load_now(page) == ReplicaLoad(waiting=5, running=5)


def test_untyped_samples_are_read_too() -> None:
    page = 'vllm:num_requests_waiting{model_name="a"} 1\nvllm:num_requests_running{model_name="a"} 0\n'
    load = load_now(page)
    assert load == ReplicaLoad(waiting=1, running=0) and load.busy


def test_an_idle_replica() -> None:
    page = VLLM_PAGE.replace("} 7.0", "} 0.0").replace("} 12.0", "} 0.0")
    load = load_now(page)
    assert load == ReplicaLoad() and not load.busy


def test_one_gauge_missing_counts_as_zero() -> None:
    page = '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name="a"} 3\n'
    assert load_now(page) == ReplicaLoad(waiting=3, running=0)


def test_a_page_without_the_gauges_is_refused() -> None:
    with pytest.raises(ValueError, match="neither vllm:num_requests_waiting nor vllm:num_requests_running"):
        load_now("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n")


def test_text_that_is_not_the_prometheus_format_is_refused() -> None:
    with pytest.raises(ValueError):
        load_now("<html>not metrics</html>\n")


def test_what_waits_in_our_servers_fair_queue_counts_as_waiting() -> None:
    # The teacher server admits a job's requests into vLLM by fair share: those it holds back wait too.
    page = VLLM_PAGE + (
        "# HELP distillery_teacher_waiting_sequences Sequences waiting for their job's share.\n"
        "# TYPE distillery_teacher_waiting_sequences gauge\n"
        "distillery_teacher_waiting_sequences 5.0\n"
    )
    assert load_now(page) == ReplicaLoad(waiting=17, running=7)


def _our_server(queued: float, waited: float) -> str:
    return VLLM_PAGE.replace("12.0", "0.0") + (
        "# TYPE distillery_teacher_waiting_sequences gauge\n"
        f"distillery_teacher_waiting_sequences {queued}\n"
        "# TYPE distillery_teacher_queue_wait_seconds histogram\n"
        f'distillery_teacher_queue_wait_seconds_sum{{client_job="ns/a"}} {waited / 2}\n'
        f'distillery_teacher_queue_wait_seconds_count{{client_job="ns/a"}} 3\n'
        f'distillery_teacher_queue_wait_seconds_sum{{client_job="ns/b"}} {waited / 2}\n'
        f'distillery_teacher_queue_wait_seconds_count{{client_job="ns/b"}} 3\n'
    )


def test_our_queue_counts_as_its_mean_length_since_the_previous_read() -> None:
    first = parse_replica_sample(_our_server(queued=0, waited=10))
    assert first.waited_seconds == 10
    # Between two reads 5 s apart, requests waited 7.5 s in all: 1.5 waiting on average, though none now
    # (a burst of scoring between two reads is not missed).
    second = parse_replica_sample(_our_server(queued=0, waited=17.5))
    assert replica_load(second, (first.waited_seconds or 0, 100.0), 105.0) == ReplicaLoad(
        waiting=1.5, running=7
    )
    # Without a previous read, or after a restart reset the total: the queue as it is now.
    assert replica_load(second, None, 105.0).waiting == 0
    restarted = parse_replica_sample(_our_server(queued=2, waited=1))
    assert replica_load(restarted, (17.5, 100.0), 105.0).waiting == 2
