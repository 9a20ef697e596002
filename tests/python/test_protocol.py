"""The protocol's one lists (runtime/kinds.def, runtime/errors.def) reach Python whole: the
message kinds through pybind11, the error kinds through the build's generated class; bodies
made on one side read on the other."""
import pytest

from xmesh import _core
from xmesh._protocol import ErrorKind, Kind, error, error_kind


def test_error_kinds_are_the_cpp_list():
    assert [(k.name, k.value) for k in ErrorKind] == _core.error_kinds()


def test_message_kinds_keep_their_numbers():
    assert (int(Kind.Hello), int(Kind.Refuse), int(Kind.Call), int(Kind.Reply)) == (1, 3, 10, 11)
    assert len(set(int(k) for k in Kind.__members__.values())) == len(Kind.__members__)


def test_error_bodies_round_trip():
    body = error(ErrorKind.NameTaken, "taken", shape={"gpus": 2})
    assert body == {"kind": "name_taken", "text": "taken", "shape": {"gpus": 2}}
    assert error_kind(body) is ErrorKind.NameTaken and ErrorKind.NameTaken == "name_taken"
    for strange in ({}, {"kind": 3}, {"kind": "no-such-kind"}, None, "supervision"):
        assert error_kind(strange) is None


@pytest.mark.parametrize("kind", list(ErrorKind))
def test_every_error_kind_reads_back(kind):
    assert error_kind(error(kind, "x")) is kind
