"""Why placement groups: the blast radius of one dead server, measured on 8 real servers.

A sequence (a prefix of KV pages) is only useful whole. Spread key by key over 8 servers, a
32-block sequence almost surely has a block on any given server, so one death breaks nearly all
sequences; striped over ``group_width`` = 2 servers by its group, only the sequences whose group
lands on the dead server break: about 2/8.
"""

from gcache import Client

SEQUENCES, BLOCKS = 200, 32


def broken_fraction(client: Client, *, grouped: bool) -> float:
    broken = 0
    for s in range(SEQUENCES):
        keys = [f"{'g' if grouped else 'k'}{s}/{b}" for b in range(BLOCKS)]
        got = client.batch_get(keys, group=f"seq{s}" if grouped else None)
        broken += any(v is None for v in got)
    return broken / SEQUENCES


def test_one_dead_server_breaks_group_width_over_n_of_grouped_sequences(cluster_factory):
    cluster = cluster_factory(8, memory="16MiB")
    with Client(cluster.addresses, timeout_s=0.5, group_width=2) as client:
        for s in range(SEQUENCES):
            values = [bytes(1024)] * BLOCKS
            assert all(client.batch_put([f"g{s}/{b}" for b in range(BLOCKS)], values,
                                        group=f"seq{s}"))
            assert all(client.batch_put([f"k{s}/{b}" for b in range(BLOCKS)], values))
        assert broken_fraction(client, grouped=True) == 0
        cluster.kill(3)
        grouped = broken_fraction(client, grouped=True)
        spread = broken_fraction(client, grouped=False)
    print(f"one of 8 servers dead: {grouped:.0%} of grouped sequences broken, "
          f"{spread:.0%} of key-by-key ones")
    assert 0.1 <= grouped <= 0.4            # about group_width / 8 = 25%
    assert spread >= 0.9                    # 1 - (7/8)^32 = 98.6% expected
