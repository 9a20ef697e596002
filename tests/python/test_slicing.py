"""Named-dimension slicing with Monarch's semantics, on real meshes and on ValueMeshes."""
import pytest
from actors_for_tests import Counter

from xmesh import this_host


@pytest.fixture(scope="module")
def mesh():
    pm = this_host().spawn_procs({"hosts": 2, "gpus": 3})
    yield pm.spawn("c", Counter)
    pm.stop()


def ranks_of(m):
    return [v["rank"] for v in m.whoami.call().get(timeout=30).values()]


def test_sizes_and_size(mesh):
    assert mesh.sizes == {"hosts": 2, "gpus": 3}
    assert mesh.size() == 6 and mesh.size("gpus") == 3 and mesh.size(("hosts", "gpus")) == 6
    assert len(mesh) == 6
    with pytest.raises(KeyError):
        mesh.size("nope")


def test_slice_keeps_with_slice_and_drops_with_int(mesh):
    kept = mesh.slice(gpus=slice(1, 3))
    assert kept.sizes == {"hosts": 2, "gpus": 2}
    assert ranks_of(kept) == [1, 2, 4, 5]
    dropped = mesh.slice(hosts=1)
    assert dropped.sizes == {"gpus": 3}
    assert ranks_of(dropped) == [3, 4, 5]
    one = mesh.slice(hosts=0, gpus=2)
    assert one.sizes == {}
    assert one.whoami.call_one().get(timeout=30)["coords"] == {"hosts": 0, "gpus": 2}
    stepped = mesh.slice(gpus=slice(0, 3, 2))
    assert ranks_of(stepped) == [0, 2, 3, 5]


def test_slice_errors(mesh):
    with pytest.raises(TypeError, match="no dimension 'racks'"):
        mesh.slice(racks=0)
    with pytest.raises(IndexError):
        mesh.slice(gpus=3)
    with pytest.raises(IndexError):
        mesh.slice(gpus=-1)
    with pytest.raises(IndexError):
        mesh.slice(gpus=slice(5, 9))
    with pytest.raises(TypeError):
        mesh.slice(gpus="0")
    with pytest.raises(ValueError):
        mesh.slice(gpus=slice(None, None, -1))


def test_flatten_split_rename(mesh):
    flat = mesh.flatten("all")
    assert flat.sizes == {"all": 6}
    assert ranks_of(flat.slice(all=slice(2, 5))) == [2, 3, 4]
    split = mesh.flatten("all").split(all=("dp", "tp"), tp=2)
    assert split.sizes == {"dp": 3, "tp": 2}
    assert ranks_of(split.slice(tp=1)) == [1, 3, 5]
    renamed = mesh.rename(gpus="workers")
    assert renamed.sizes == {"hosts": 2, "workers": 3}
    assert ranks_of(renamed.slice(workers=0)) == [0, 3]
    with pytest.raises(ValueError, match="sparse"):
        mesh.slice(gpus=slice(0, 3, 2)).flatten("x")
    with pytest.raises(ValueError):
        mesh.split(gpus=("a", "b"))
    with pytest.raises(ValueError):
        mesh.split(gpus=("a", "b"), b=2)


def test_value_mesh_follows_slices(mesh):
    vm = mesh.whoami.call().get(timeout=30)
    assert vm.sizes == {"hosts": 2, "gpus": 3}
    sub = vm.slice(hosts=1)
    assert [v["rank"] for v in sub.values()] == [3, 4, 5]
    assert vm.item(hosts=1, gpus=0)["rank"] == 3
    with pytest.raises(KeyError):
        vm.item(hosts=1)
    with pytest.raises(KeyError):
        vm.item(hosts=1, gpus=0, racks=0)
    assert vm.slice(hosts=0, gpus=1).item()["rank"] == 1
    html = vm._repr_html_()
    assert "<table>" in html and html.count("<tr>") == 7
    text = repr(vm)
    assert text.startswith("ValueMesh({'hosts': 2, 'gpus': 3}):") and "(hosts=1, gpus=2)" in text


def test_current_rank_and_env_per_rank(mesh):
    sub = mesh.slice(hosts=1)
    infos = list(mesh.whoami.call().get(timeout=30).values())
    assert [i["coords"] for i in infos][4] == {"hosts": 1, "gpus": 1}
    assert all(i["size"] == {"hosts": 2, "gpus": 3} for i in infos)
    # Called on the whole mesh, the message's point is the actor's own.
    assert [(i["message_rank"], i["message_coords"], i["message_size"]) for i in infos] == \
        [(i["rank"], i["coords"], i["size"]) for i in infos]
    assert [i["cuda"] for i in infos] == ["0", "1", "2", "0", "1", "2"]
    assert len({i["pid"] for i in infos}) == 6
    # Actors spawned on a slice see ranks and shape relative to that slice.
    pm = mesh._proc_mesh.slice(hosts=1)
    sub_actors = pm.spawn("sub", Counter)
    infos = list(sub_actors.whoami.call().get(timeout=30).values())
    assert [i["rank"] for i in infos] == [0, 1, 2]
    assert infos[0]["size"] == {"gpus": 3} and infos[0]["message_size"] == {"gpus": 3}
    assert sub is not None


def test_current_rank_is_the_messages_point_in_the_slice_called(mesh):
    """Monarch's current_rank(): where the actor sits in the mesh or slice the message went to
    (context().actor_instance.rank stays the actor's own)."""
    def seen(m, adverb="call"):
        if adverb == "call":
            return [(i["rank"], i["message_rank"], i["message_coords"], i["message_size"])
                    for i in m.whoami.call().get(timeout=30).values()]
        i = getattr(m.whoami, adverb)().get(timeout=30)
        return i["rank"], i["message_rank"], i["message_coords"], i["message_size"]

    assert seen(mesh.slice(gpus=slice(1, 3))) == [
        (1, 0, {"hosts": 0, "gpus": 0}, {"hosts": 2, "gpus": 2}), (2, 1, {"hosts": 0, "gpus": 1}, {"hosts": 2, "gpus": 2}),
        (4, 2, {"hosts": 1, "gpus": 0}, {"hosts": 2, "gpus": 2}), (5, 3, {"hosts": 1, "gpus": 1}, {"hosts": 2, "gpus": 2})]
    assert seen(mesh.slice(hosts=1)) == [(3, 0, {"gpus": 0}, {"gpus": 3}), (4, 1, {"gpus": 1}, {"gpus": 3}),
                                         (5, 2, {"gpus": 2}, {"gpus": 3})]
    assert seen(mesh.slice(hosts=1, gpus=2), "call_one") == (5, 0, {}, {})
    # Reshaped without slicing: the message's extent is the reshaped one.
    assert [s[1:] for s in seen(mesh.flatten("all").slice(all=slice(4, 6)))] == [(0, {"all": 0}, {"all": 2}),
                                                                                (1, {"all": 1}, {"all": 2})]
    assert seen(mesh.rename(gpus="workers").slice(hosts=0))[2] == (2, 2, {"workers": 2}, {"workers": 3})
    # choose(): the chosen actor's point in the mesh it was chosen from.
    for _ in range(3):
        rank, message_rank, coords, size = seen(mesh.slice(hosts=1), "choose")
        assert message_rank == rank - 3 and coords == {"gpus": rank - 3} and size == {"gpus": 3}
    # An async endpoint sees its own message's point too.
    assert [v for v in mesh.slice(gpus=2).arank.call().get(timeout=30).values()] == [(0, {"hosts": 2}), (1, {"hosts": 2})]
