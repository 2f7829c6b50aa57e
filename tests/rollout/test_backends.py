"""The event-driven rollout interface (rollout/backends.py): every submitted rollout comes back exactly once,
finished or aborted with the tokens it had; the batched backend is exactly one batched generate call; the
vLLM server backend delivers rollouts as they finish and aborts running ones."""

import importlib.util
import time

import pytest
from helpers import assert_engine_may_use_its_kernels, assert_on_policy, build_served_model

from trl_alloc.rollout.backends import BatchedRollouts, VLLMServerRollouts
from trl_alloc.serving.client import AllocVLLMClient


def test_batched_rollouts_are_one_generate_call_over_everything_pending(tiny_random_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_alloc.evaluation import TransformersBackend, tokenize_prompts

    model = AutoModelForCausalLM.from_pretrained(tiny_random_dir)
    tok = AutoTokenizer.from_pretrained(tiny_random_dir)
    backend = TransformersBackend(model, tok, batch_size=16)
    prompts = tokenize_prompts(tok, ["1+2=", "13+4="])
    rollouts = BatchedRollouts.from_backend(backend, temperature=1.0, seed=5)
    first = rollouts.submit(prompts[0], n=2, max_tokens=3, tag="a")
    second = rollouts.submit(prompts[1], n=1, max_tokens=6, tag="b")
    dropped = rollouts.submit(prompts[1], n=1, max_tokens=6, tag="c")
    assert rollouts.in_flight == 4
    aborted = rollouts.abort(dropped)
    assert [(r.tag, r.finish_reason, r.token_ids) for r in aborted] == [("c", "abort", [])]
    done = rollouts.next_completed()
    assert rollouts.in_flight == 0 and rollouts.calls == 1 and rollouts.next_completed() == []
    assert sorted(r.rid for r in done) == sorted(first + second)
    # exactly the batched call: the same prompts, the largest cap, the call's seed; each cut to its own cap
    ids, _ = backend.generate([prompts[0], prompts[0], prompts[1]], 1, 6, 1.0, seed=5)
    by_rid = {r.rid: r for r in done}
    for rid, expected, cap in zip(first + second, ids, (3, 3, 6)):
        assert by_rid[rid].token_ids == expected[0][:cap] and len(by_rid[rid].token_ids) <= cap
    assert all(r.finish_reason in ("stop", "length") for r in done)


def test_a_finished_rollout_is_never_neither_in_flight_nor_delivered():
    """`StreamedRollouts._finish` moves a rollout from in flight to the delivery queue in one step. It used to take
    it off in flight first: a poll in between saw nothing in flight and nothing delivered, `next_completed`
    returned [] at once, and the round driver raised its "no rollout ended" TimeoutError (a live-server test
    lost two of four rollouts that way). A slow queue `put` holds that moment open here."""
    import queue
    import threading

    from trl_alloc.rollout.backends import StreamedRollouts

    class SlowQueue(queue.Queue):
        def put(self, item, *args, **kwargs):
            time.sleep(0.05)
            super().put(item, *args, **kwargs)

    class ThreadRollouts(StreamedRollouts):  # each rollout generates 3 tokens in its own thread, then ends
        def _start(self, r, cancel):
            def run():
                self._extend(r, [1, 2, 3], [0.0] * 3, "stop")
                self._finish(r)
            threading.Thread(target=run, daemon=True).start()

    rollouts = ThreadRollouts(request_timeout=30)
    rollouts._done = SlowQueue()
    for _ in range(5):
        rids = rollouts.submit([5, 6], n=1, max_tokens=3)
        while rollouts.in_flight:
            time.sleep(0.001)
        assert [r.rid for r in rollouts.next_completed(timeout=1)] == rids


def check_arrival_order(rollouts, hold=None, tries=3):
    """A short rollout arrives before a long one started first; every rollout once, with all its tokens and
    log-probs. `hold` freezes the engine (a server's `/pause?mode=keep`): the long request, then the short ones,
    wait in its queue and start together at `/resume` (the tiny served model decodes 480 tokens faster than a busy
    2-core machine lands a request, and its API server may deliver them late and at once). Without it, the short
    ones are submitted once the long one has started. The order is a race between the engine and the short
    streams' reader threads, so it is tried up to `tries` times; a backend that delivers in submission order
    fails every try."""
    import time

    firsts = []
    for _ in range(tries):
        if hold is None:
            long = rollouts.submit([5, 6, 7], n=1, max_tokens=480, tag="long")
            deadline = time.monotonic() + 120
            while not rollouts.generated_tokens().get(long[0]) and rollouts.in_flight and time.monotonic() < deadline:
                time.sleep(0.002)  # the long one runs
            short = rollouts.submit([8, 9], n=3, max_tokens=4, tag="short")
        else:
            with hold():
                long = rollouts.submit([5, 6, 7], n=1, max_tokens=480, tag="long")
                time.sleep(1.0)  # (the requests reach the frozen engine's queue, the long one first)
                short = rollouts.submit([8, 9], n=3, max_tokens=4, tag="short")
                time.sleep(1.0)
                assert rollouts.generated_tokens() == dict.fromkeys(long + short, 0)  # none has started
        seen = rollouts.next_completed(timeout=120)
        assert seen  # something arrived
        firsts.append(seen[0].tag)
        while rollouts.in_flight:
            seen += rollouts.next_completed(timeout=120)
        assert sorted(r.rid for r in seen) == sorted(long + short)  # each exactly once
        assert all(len(r.token_ids) == r.max_tokens == len(r.logprobs) and r.finish_reason == "length" for r in seen)
        assert all(lp <= 0 for r in seen for lp in r.logprobs)
        # as they finish, not in the order submitted: a short one (4 tokens) arrives first, though the long one was
        # submitted first. (Not "all three short ones before the long one": every stream has its own reader thread,
        # and on a busy 2-core machine the tiny model can decode the other 476 tokens while one short stream's
        # reader waits for a core; seen in fresh clones: short, short, long, short; and once, on an idle Xeon, the
        # long one first.)
        if firsts[-1] == "short":
            return
    pytest.fail(f"the long rollout, submitted first, arrived first in all {tries} tries (first arrivals: {firsts})")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_vllm_server_rollouts_arrive_as_they_finish_and_abort(vllm_server):
    import torch

    from trl_alloc.rollout.quality_head import QualityHead

    server, model = vllm_server, vllm_server.model
    rollouts = VLLMServerRollouts(server.url, temperature=1.0, extra={"ignore_eos": True})  # (unseeded: see `seed`)
    try:
        client = AllocVLLMClient(base_url=server.url, connection_timeout=30.0)
        try:
            check_arrival_order(rollouts, hold=client.paused)
        finally:
            client.close()
        # abort: the rollout comes back with the tokens it had, and no later
        running = rollouts.submit([5, 6, 7], n=1, max_tokens=480, tag="cut")
        cut = rollouts.abort(running)
        assert [r.rid for r in cut] == running and cut[0].finish_reason == "abort"
        assert len(cut[0].token_ids) < 480 and rollouts.in_flight == 0 and rollouts.next_completed(timeout=1) == []

        # the detection point: a snapshot at 5 tokens while the same stream goes on to the end; one that
        # finishes before 5 tokens gives none; aborting after the snapshot keeps the tokens generated since
        going = rollouts.submit([5, 6, 7], n=2, max_tokens=40, tag="go", detect_at=5)
        early = rollouts.submit([8, 9], n=1, max_tokens=3, tag="early", detect_at=5)
        got = []
        while rollouts.in_flight or not got:
            got += rollouts.next_completed(timeout=120)
        snaps = [r for r in got if r.finish_reason == "detect"]
        final = {r.rid: r for r in got if r.finish_reason != "detect"}
        assert sorted(r.rid for r in snaps) == sorted(going) and set(final) == set(going + early)
        for s in snaps:
            assert len(s.token_ids) == 5 == len(s.logprobs) and final[s.rid].token_ids[:5] == s.token_ids
            assert len(final[s.rid].token_ids) == 40  # continued in the same request
        pruned = rollouts.submit([5, 6, 7], n=1, max_tokens=120, tag="prune", detect_at=5)
        snap = rollouts.next_completed(timeout=120)
        assert [(r.rid, r.finish_reason) for r in snap[:1]] == [(pruned[0], "detect")]  # the snapshot comes first
        if len(snap) > 1:  # (timing: the server finished all 120 tokens before this poll; nothing left to abort)
            assert [(r.rid, r.finish_reason) for r in snap[1:]] == [(pruned[0], "length")]
            assert snap[1].token_ids[:5] == snap[0].token_ids and rollouts.in_flight == 0
        else:
            cut = rollouts.abort(pruned)
            assert cut[0].finish_reason == "abort" and 5 <= len(cut[0].token_ids) < 120
            assert cut[0].token_ids[:5] == snap[0].token_ids and rollouts.in_flight == 0
        check_counts_hold_while_paused(rollouts, server.url)
    finally:
        rollouts.close()
    with pytest.raises(RuntimeError, match="hidden states of size 32, the served model's are 64"):
        VLLMServerRollouts(server.url, quality_head=QualityHead(32, 8, detect_length=5))  # another model's
    torch.manual_seed(0)
    head = QualityHead(model.config.hidden_size, 16, detect_length=5)
    rollouts = VLLMServerRollouts(server.url, temperature=1.0, extra={"ignore_eos": True}, quality_head=head)
    try:
        check_scores_in_engine(rollouts, model, head)
    finally:
        rollouts.close()


def check_counts_hold_while_paused(rollouts, url, tries=3):
    """A stream's weight push (`StreamDriver.push`): under vLLM's `/pause?mode=keep` nothing is generated, so the
    tokens counted then (`generated_tokens`) are exactly the old weights'; after `/resume` the same requests go on
    to the end, nothing regenerated. (On a busy 2-core machine the API server may deliver a rollout's tokens late
    and all at once, so a try may see every rollout finished before the pause: tried again, up to `tries` times.)"""
    import time

    client = AllocVLLMClient(base_url=url, connection_timeout=30.0)
    for _ in range(tries):
        rids = rollouts.submit([5, 6, 7], n=4, max_tokens=480, tag="pause")
        deadline = time.monotonic() + 120
        while max(rollouts.generated_tokens().values(), default=1) < 1 and time.monotonic() < deadline:  # one runs
            time.sleep(0.005)
        with client.paused():
            time.sleep(0.3)  # tokens generated before the pause arrive
            marks = rollouts.generated_tokens()  # the rollouts still in flight, frozen mid-way or not started
            time.sleep(1.0)
            assert rollouts.generated_tokens() == marks  # frozen: nothing generated while paused
        got = []
        while rollouts.in_flight:
            got += rollouts.next_completed(timeout=120)
        got += rollouts.next_completed(timeout=1)
        assert sorted(r.rid for r in got) == rids and all(len(r.token_ids) == 480 for r in got)  # each once, whole
        assert set(marks) <= set(rids) and all(n < 480 for n in marks.values())
        if any(0 < n < 480 for n in marks.values()):
            break  # (4 and 5 tokens when first measured)
    else:
        pytest.fail(f"no rollout was running at the pause in {tries} tries (the server delivered each one whole)")
    client.close()


def check_scores_in_engine(rollouts, model, head):
    """ARROL's head inside the engine (worker extension): the score and hidden state each snapshot carries equal
    the trainer-side forward of prompt + partial (`last_hidden_states`), rollout by rollout."""
    import torch

    from trl_alloc.rollout.quality_head import last_hidden_states

    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14, 15, 16]]
    for i, p in enumerate(prompts):
        rollouts.submit(p, n=2, max_tokens=12, tag=i, detect_at=5)
    rollouts.submit([8, 9], n=1, max_tokens=5, tag="short", detect_at=5)  # ends at 5 tokens: no snapshot
    got = []
    while rollouts.in_flight or got == []:
        got += rollouts.next_completed(timeout=120)
    got += rollouts.next_completed(timeout=1)
    snaps = [r for r in got if r.finish_reason == "detect"]
    assert sorted(r.tag for r in snaps) == [0, 0, 1, 1, 2, 2] and rollouts.scored == 6
    assert all(len(r.token_ids) == 5 for r in snaps)
    final = {r.rid: r for r in got if r.finish_reason != "detect"}
    assert all(final[r.rid].token_ids[:5] == r.token_ids for r in snaps)  # the snapshot is the rollout's prefix
    with torch.no_grad():
        want = last_hidden_states(model, [r.prompt_ids + r.token_ids for r in snaps], 0)
        expected = head(want).double()
    hidden = torch.tensor([r.info["hidden"] for r in snaps])
    assert torch.allclose(hidden, want, atol=1e-4, rtol=1e-4), (hidden - want).abs().max()
    scores = torch.tensor([r.info["score"] for r in snaps], dtype=torch.float64)
    assert torch.allclose(scores, expected, atol=1e-4), (scores, expected)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_inprocess_vllm_rollouts_stream_abort_and_score_in_the_engine(tmp_path, monkeypatch):
    """The in-process backend (vLLM's AsyncLLM, no server): rollouts arrive as they finish, an aborted one comes
    back partial, and the worker extension scores the detection point as the trainer does."""
    import torch

    from trl_alloc.rollout.inprocess import VLLMInProcessRollouts
    from trl_alloc.rollout.quality_head import QualityHead

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = build_served_model(str(tmp_path / "model"))
    torch.manual_seed(0)
    head = QualityHead(model.config.hidden_size, 16, detect_length=5)
    rollouts = VLLMInProcessRollouts.start(str(tmp_path / "model"), temperature=1.0, extra={"ignore_eos": True},
                                           quality_head=head, request_timeout=120)
    try:
        assert_engine_may_use_its_kernels(rollouts._rpc("cpu_features"))  # AMX asked for in the engine core's process
        check_arrival_order(rollouts)

        running = rollouts.submit([5, 6, 7], n=1, max_tokens=480, tag="cut", detect_at=5)
        snap = rollouts.next_completed(timeout=120)
        assert [(r.rid, r.finish_reason, len(r.token_ids)) for r in snap] == [(running[0], "detect", 5)]
        [cut] = rollouts.abort(running)
        assert cut.finish_reason == "abort" and 5 <= len(cut.token_ids) < 480 and rollouts.in_flight == 0
        assert cut.token_ids[:5] == snap[0].token_ids and rollouts.next_completed(timeout=1) == []
        rollouts.scored = 0
        check_scores_in_engine(rollouts, model, head)
        # on-policy: the engine's default dtype on a CPU is the trainer's float32
        assert rollouts._rpc("served_dtype") == "float32"
        rollouts.submit([5, 6, 7], n=2, max_tokens=8, tag="policy")
        sampled = []
        while rollouts.in_flight:
            sampled += rollouts.next_completed(timeout=120)
        assert_on_policy(model, [r.prompt_ids for r in sampled], [r.token_ids for r in sampled],
                         [r.logprobs for r in sampled])
    finally:
        rollouts.close()
        rollouts.shutdown()


class ResettingProxy:
    """A TCP relay to the live server that resets the first `resets` connections once it has read their request
    (what a kept-alive connection closed by the server as a request goes out looks like to the client)."""

    def __init__(self, url, resets):
        import socket
        import threading
        from urllib.parse import urlparse

        target = urlparse(url)
        self.target, self.resets = (target.hostname, target.port), resets
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        import socket
        import struct
        import threading

        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            if self.resets:
                self.resets -= 1
                conn.recv(65536)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()  # RST
                continue
            upstream = socket.create_connection(self.target)
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(2)
                except OSError:
                    pass

    def close(self):
        self.listener.close()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_a_reset_connection_is_sent_again_once(vllm_server):
    """A rollout whose connection is reset before any response is sent once more and completes; reset twice, it
    ends with the connection error (never retried forever)."""
    import requests

    model = requests.get(vllm_server.url + "/v1/models", timeout=30).json()["data"][0]["id"]
    for resets, completes in ((1, True), (2, False)):
        proxy = ResettingProxy(vllm_server.url, resets)
        rollouts = VLLMServerRollouts(proxy.url, model=model, temperature=1.0, extra={"ignore_eos": True})
        try:
            rids = rollouts.submit([5, 6, 7], n=1, max_tokens=8, tag="t")
            [got] = rollouts.next_completed(timeout=120)
            assert got.rid == rids[0] and rollouts.resent == 1 and rollouts.in_flight == 0
            if completes:
                assert got.finish_reason == "length" and len(got.token_ids) == 8 == len(got.logprobs)
            else:
                assert got.finish_reason.startswith("error: ConnectionError") and "Connection aborted" in \
                    got.finish_reason and got.token_ids == []
        finally:
            rollouts.close()
            proxy.close()
