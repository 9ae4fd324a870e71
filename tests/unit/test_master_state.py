"""The master's replicated state machine, without Raft: commands and the epoch rule."""

import pytest

from gcache.master.state import (
    AnnounceMaster,
    Applied,
    ClusterState,
    Drain,
    Leave,
    Refused,
    Register,
    ServerRecord,
    SetState,
)


def record(server_id="s1", address="127.0.0.1:7700", capacity=1 << 30) -> ServerRecord:
    return ServerRecord(server_id, address, "host-a", capacity)


def test_the_epoch_moves_with_membership_and_state_only():
    state = ClusterState()
    assert state.apply(Register(record())) == Applied(1)
    assert state.apply(Register(record())) == Applied(1)      # the same again: no change
    assert state.apply(Register(record(address="127.0.0.1:7701"))) == Applied(2)
    assert state.apply(SetState("s1", "suspect")) == Applied(3)
    assert state.apply(SetState("s1", "suspect")) == Applied(3)
    assert state.apply(Register(record(address="127.0.0.1:7701"))) == Applied(4)   # alive again
    assert state.servers["s1"].state == "alive"
    assert state.apply(AnnounceMaster("r1:1", "g1:1")) == Applied(4)
    assert state.masters == {"r1:1": "g1:1"}


def test_state_changes_of_unknown_servers_change_nothing():
    state = ClusterState()
    assert state.apply(SetState("nobody", "dead")) == Applied(0) and not state.servers


@pytest.mark.parametrize("command, message", [(SetState("s1", "sleepy"), "not one of"),
                                              (("explode",), "unknown command")])
def test_bad_commands_are_refused(command, message):
    state = ClusterState()
    state.apply(Register(record()))
    with pytest.raises(ValueError, match=message):
        state.apply(command)


def test_drain_and_leave_check_their_precondition_in_log_order():
    state = ClusterState()
    assert isinstance(state.apply(Drain("s1")), Refused)           # unknown server
    state.apply(Register(record()))
    assert isinstance(state.apply(Leave("s1")), Refused)           # not draining
    assert state.apply(Drain("s1")) == Applied(2) and state.servers["s1"].state == "draining"
    assert state.apply(Leave("s1")) == Applied(3) and state.servers["s1"].state == "left"


def test_the_service_implements_every_rpc_of_the_proto():
    """The generated servicer base raises NotImplementedError for each RPC; ours must override
    every one, including any added to master.proto later."""
    from gcache.master.service import MasterService
    from gcache.master.tenant_rpcs import TenantRpcs
    from gcache.proto import master_pb2

    methods = master_pb2.DESCRIPTOR.services_by_name["Master"].methods
    ours = {**TenantRpcs.__dict__, **MasterService.__dict__}      # the tenant calls' mixin
    assert [m.name for m in methods if m.name not in ours] == []


def test_commands_survive_the_journal():
    """pysyncobj pickles each command into its journal and replays it on restart."""
    import pickle

    commands = [Register(record()), SetState("s1", "dead"), Drain("s1"), Leave("s1"),
                AnnounceMaster("r1:1", "g1:1")]
    assert [pickle.loads(pickle.dumps(c)) for c in commands] == commands
