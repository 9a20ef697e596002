"""Errors a caller sees: endpoint exceptions, bad __init__, bad arguments, bad use."""
import pytest
from xmesh_testing import run_program
from actors_for_tests import BadInit, Counter

from xmesh import ActorError, SupervisionError, this_host


@pytest.fixture(scope="module")
def procs():
    pm = this_host().spawn_procs({"gpus": 2})
    yield pm
    pm.stop()


@pytest.fixture(scope="module")
def counters(procs):
    return procs.spawn("err_counters", Counter)


def test_endpoint_exception_is_actor_error_with_remote_traceback(counters):
    with pytest.raises(ActorError) as info:
        counters.slice(gpus=1).fail.call_one("boom").get(timeout=30)
    e = info.value
    assert e.rank == 1 and e.coords == {"gpus": 1} and e.method == "fail"
    assert isinstance(e.exception, ValueError) and str(e.exception) == "boom on rank 1"
    text = str(e)
    assert "Traceback (most recent call last)" in text and "actors_for_tests.py" in text
    assert "ValueError: boom on rank 1" in text
    # The actor lives on.
    assert counters.slice(gpus=1).incr.call_one().get(timeout=30) == 1


def test_call_reports_failing_rank_and_count(counters):
    with pytest.raises(ActorError) as info:
        counters.fail.call("x").get(timeout=30)
    assert "2 of 2 ranks failed" in str(info.value)
    assert info.value.coords in ({"gpus": 0}, {"gpus": 1})


def test_init_failure_surfaces_at_await_and_first_call(procs):
    """A failing __init__ fails the actor (Monarch's rule): awaiting the mesh and every later
    call raise a SupervisionError (a RuntimeError) carrying Monarch's report and the traceback."""
    bad = procs.spawn("bad", BadInit)
    with pytest.raises(SupervisionError, match="init exploded"):
        bad.initialized.get(timeout=30)
    with pytest.raises(SupervisionError) as info:
        bad.ping.call().get(timeout=30)
    text = str(info.value)
    assert isinstance(info.value, RuntimeError) and info.value.endpoint == "bad.ping()"
    assert text.startswith("Endpoint call bad.ping() failed, The actor BadInit 'bad' rank ")
    assert "and all its descendants have failed:" in text and "__init__ raised:" in text
    assert "RuntimeError: init exploded" in text


def test_unpicklable_argument_fails_at_the_caller(counters):
    with pytest.raises(TypeError, match="arguments of echo\\(\\) cannot be sent"):
        counters.echo.call((x for x in []))  # a generator cannot be pickled
    # A lambda can (cloudpickle), and comes back callable.
    assert counters.slice(gpus=0).echo.call_one(lambda v: v + 1).get(timeout=30)(1) == 2


def test_unpicklable_result_is_a_clear_error(counters):
    with pytest.raises(ActorError, match="cannot be sent back"):
        counters.slice(gpus=0).unpicklable_result.call_one().get(timeout=30)


def test_unknown_and_plain_methods(counters):
    with pytest.raises(AttributeError, match="not an endpoint: decorate it with @endpoint, or call it as one"):
        counters.not_an_endpoint.call()  # Monarch's NotAnEndpoint: as_endpoint(...) would call it
    with pytest.raises(AttributeError, match="has no endpoint 'nope'"):
        counters.nope


def test_exception_that_cannot_be_unpickled_arrives_as_text(counters):
    with pytest.raises(ActorError) as info:
        counters.slice(gpus=0).raise_picky.call_one().get(timeout=30)
    assert info.value.exception is None
    assert "Picky: 1-2" in str(info.value)


def test_stopped_mesh_cannot_be_called():
    pm = this_host().spawn_procs({"gpus": 1})
    c = pm.spawn("tmp", Counter)
    assert c.get.call_one().get(timeout=30) == 0
    pm.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        c.get.call_one()
    with pytest.raises(RuntimeError, match="stopped"):
        pm.spawn("again", Counter)


def test_spawn_argument_errors(procs):
    with pytest.raises(TypeError):
        procs.spawn(Counter)
    with pytest.raises(TypeError):
        procs.spawn("x", 3)
    with pytest.raises(TypeError, match="subclass of Actor"):
        procs.spawn("x", dict)
    with pytest.raises(ValueError):
        this_host().spawn_procs({"gpus": 0})
    with pytest.raises(ValueError):
        this_host().spawn_procs({"bad name": 1})
    with pytest.raises(TypeError, match="per_host must be a dict"):
        this_host().spawn_procs([2])
    # A mistyped size fails at once instead of forking until the machine gives out.
    with pytest.raises(ValueError, match="1,000,000,000 procs per host; at most 1,024"):
        this_host().spawn_procs({"gpus": 10**9})
    with pytest.raises(TypeError, match="env must be a dict"):
        this_host().spawn_procs({"gpus": 1}, env=3)
    with pytest.raises(ValueError, match=r"env\['A'\] must be a string or a number, got None"):
        this_host().spawn_procs({"gpus": 1}, env={"A": None})
    with pytest.raises(ValueError, match="env names must be non-empty strings without '='"):
        this_host().spawn_procs({"gpus": 1}, env={"A=B": "1"})


def test_an_endpoint_named_like_a_mesh_attribute_is_refused_at_class_definition():
    """Issue 16, defect 11: `size` as an endpoint failed at call time as "'function' object has no
    attribute 'call_one'"; the clash is now named where the class is written."""
    from xmesh import Actor, endpoint

    with pytest.raises(TypeError, match=r"Sized\.size: an endpoint cannot be named 'size'.*mesh\.size"):
        class Sized(Actor):
            @endpoint
            def size(self):
                return 1

    class Fine(Actor):  # a plain method of that name is the actor's own business
        def size(self):
            return 1

        @endpoint
        def total(self):
            return 2


def test_remote_tracebacks_leave_xmesh_frames_out_unless_asked(fresh_rundir):
    """The endpoint's traceback shows the user's frames; XMESH_DEBUG_TRACEBACKS=1 shows xmesh's
    own too (for debugging xmesh itself)."""
    program = ("from xmesh import this_host, Actor, endpoint\n"
               "class A(Actor):\n"
               "    @endpoint\n"
               "    def boom(self):\n"
               "        raise ValueError('boom')\n"
               "procs = this_host().spawn_procs({'gpus': 1})\n"
               "try:\n"
               "    procs.spawn('a', A).boom.call_one().get()\n"
               "except Exception as e:\n"
               "    print('REMOTE', e.remote_traceback)\n")
    plain = run_program(program, env={"XMESH_RUNTIME_DIR": fresh_rundir})
    assert plain.returncode == 0, plain.stderr
    assert "in boom" in plain.stdout and "raise ValueError('boom')" in plain.stdout
    assert "_proc/actor_host.py" not in plain.stdout, plain.stdout
    debug = run_program(program, env={"XMESH_RUNTIME_DIR": fresh_rundir, "XMESH_DEBUG_TRACEBACKS": "1"})
    assert debug.returncode == 0, debug.stderr
    assert "_proc/actor_host.py" in debug.stdout and "in boom" in debug.stdout, debug.stdout
