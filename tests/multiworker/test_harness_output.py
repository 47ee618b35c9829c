"""How harness.rank_stdout reads horovodrun's output: a rank's own lines,
without NCCL's log lines (GPU runs set NCCL_DEBUG), keeping the rank's lines
that merely name NCCL, such as an exchange's error.

The NCCL lines are as NCCL 2.28 printed them on an H200 under
`NCCL_DEBUG=INFO horovodrun -np 1` (2026-11-25, ed385cf); the WARN line has the form
NCCL gives its warnings (the source file and line before "NCCL WARN").
"""
import harness

OUTPUT = """\
[0]<stdout>:vm:1884:1884 [0] NCCL INFO ENV/Plugin: Could not find: libnccl-env.so
[0]<stdout>:vm:1884:1884 [0] NCCL INFO NCCL version 2.28.9+cuda13.0
[0]<stdout>:vm:1884:1884 [0] NCCL INFO comm 0x2d48c900 rank 0 nRanks 1 nNodes 1 localRanks 1 \
localRank 0 MNNVL 0
[0]<stdout>:vm:1884:1901 [0] transport/p2p.cc:275 NCCL WARN Cuda failure 'invalid argument'
[1]<stdout>:vm:1885:1885 [1] NCCL INFO NCCL version 2.28.9+cuda13.0
[0]<stdout>:worker line: NCCL all_reduce gave 4.0
[0]<stderr>:[rank 0] an error on stderr
[0]<stdout>:[rank 0] an all-to-all did not end within 8 s (SOK_EV_EXCHANGE_TIMEOUT); NCCL \
communicator aborted
[1]<stdout>:[rank 1] loss 0.25
"""


def test_rank_stdout_drops_nccl_log_lines_and_keeps_lines_that_name_nccl():
    assert harness.rank_stdout(OUTPUT, 0).splitlines() == [
        "worker line: NCCL all_reduce gave 4.0",
        "[rank 0] an all-to-all did not end within 8 s (SOK_EV_EXCHANGE_TIMEOUT); NCCL "
        "communicator aborted",
    ]


def test_rank_stdout_keeps_each_rank_to_its_own_lines():
    assert harness.rank_stdout(OUTPUT, 1).splitlines() == ["[rank 1] loss 0.25"]
    assert harness.rank_stdout(OUTPUT, 2) == ""
