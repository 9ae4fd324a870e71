"""How ``MasterClient`` turns the masters' gRPC answers into the error tree, against gRPC servers
in this process that answer the way a follower, a leader and an unknown-server refusal do."""

from concurrent import futures

import grpc
import pytest

from gcache.errors import ConfigError, MasterError, NotLeader, NotRegistered, Unavailable
from gcache.master_client import LEADER_KEY, MasterClient
from gcache.proto import master_pb2 as pb
from gcache.proto import master_pb2_grpc as pb_grpc


class Member(pb_grpc.MasterServicer):
    """A member that is a follower (naming ``leader``) or the leader of a one-server map."""

    def __init__(self, *, follower: bool, leader: str = "") -> None:
        self.follower, self.leader = follower, leader

    def GetClusterMap(self, request, context):
        if self.follower:
            context.set_trailing_metadata(((LEADER_KEY, self.leader),))
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not the leader")
        return pb.ClusterMap(epoch=7, changed=True, servers=[pb.Server(id="s1")])

    def Heartbeat(self, request, context):
        context.abort(grpc.StatusCode.NOT_FOUND, f"server {request.id!r} is not registered")

    def Drain(self, request, context):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no such thing")


@pytest.fixture
def serve():
    started = []

    def start(member: Member) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_MasterServicer_to_server(member, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        started.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in started:
        server.stop(grace=None)


def test_a_follower_redirects_to_the_leader_it_names(serve):
    leader = serve(Member(follower=False))
    follower = serve(Member(follower=True, leader=leader))
    with MasterClient([follower], timeout_s=2.0) as masters:
        reply = masters.cluster_map()
    assert (reply.epoch, [s.id for s in reply.servers]) == (7, ["s1"])


def test_every_member_a_follower_is_not_leader_and_unavailable(serve):
    members = [serve(Member(follower=True)) for _ in range(2)]
    with MasterClient(members, timeout_s=2.0) as masters, pytest.raises(NotLeader) as caught:
        masters.cluster_map()
    assert isinstance(caught.value, Unavailable)
    assert "GetClusterMap: no master answered" in str(caught.value)


def test_no_member_reachable_is_unavailable_not_not_leader():
    with MasterClient(["127.0.0.1:1"], timeout_s=0.5) as masters, \
            pytest.raises(Unavailable) as caught:
        masters.status()
    assert not isinstance(caught.value, NotLeader)


def test_refusals_map_to_their_errors(serve):
    leader = serve(Member(follower=False))
    with MasterClient([leader], timeout_s=2.0) as masters:
        with pytest.raises(NotRegistered, match="not registered"):
            masters.heartbeat("nobody")
        with pytest.raises(MasterError, match="Drain refused by .*no such thing") as caught:
            masters.drain("nobody")
    assert not isinstance(caught.value, (NotRegistered, Unavailable))


def test_no_address_is_a_config_error():
    with pytest.raises(ConfigError, match="master"):
        MasterClient([])
