"""What the thread tests share (tests/test_threads.py, tests/test_concurrency.py):
a Runner that starts functions in threads, stops them together and collects
their errors and counts, and a Gate that lets a checker look at a buffer
between two record calls of the writer threads."""

import collections
import contextlib
import threading
import time
import traceback


class Gate:
    """Writers pass it together (`with gate:` around a record call); a
    checker holds it alone (`with gate.alone():`), once the calls in flight
    have ended, and no writer passes meanwhile."""

    def __init__(self):
        self.cv = threading.Condition()
        self.inside = 0
        self.closed = False

    def __enter__(self):
        with self.cv:
            self.cv.wait_for(lambda: not self.closed)
            self.inside += 1

    def __exit__(self, *exc):
        with self.cv:
            self.inside -= 1
            self.cv.notify_all()

    @contextlib.contextmanager
    def alone(self):
        with self.cv:
            self.cv.wait_for(lambda: not self.closed)
            self.closed = True
            self.cv.wait_for(lambda: self.inside == 0)
        try:
            yield
        finally:
            with self.cv:
                self.closed = False
                self.cv.notify_all()


class Runner:
    """Starts functions in threads, stops them together, collects errors."""

    def __init__(self):
        self.stop = threading.Event()
        self.errors = []
        self.threads = []
        self.counts = collections.Counter()
        # entered by `writer` around each record call: a test that must look
        # at the buffer between two of them makes it a Gate
        self.gate = contextlib.nullcontext()

    def spawn(self, name, fn, *args):
        def run():
            try:
                fn(*args)
            except BaseException:  # noqa: BLE001 - any exception fails the test
                self.errors.append(f"{name}:\n{traceback.format_exc()}")
                self.stop.set()

        t = threading.Thread(target=run, name=name, daemon=True)
        self.threads.append(t)

    def start(self):
        """Starts the threads, the last spawned first: tests spawn their
        writers first, and a thread started while two writers pass the GIL
        back and forth in small calls can wait seconds for its first turn
        (docs/design.md, "The binding's one idiom")."""
        for t in reversed(self.threads):
            t.start()

    def run(self, duration, until=None, limit=60.0):
        """Runs the threads for `duration` seconds, then on until `until()`
        holds (the counts the test asserts on), for at most `limit` seconds
        in all: a slow build (ASan) or a loaded machine gets more time to
        reach them instead of a failure, and a fast one stops on time."""
        self.start()
        self.stop.wait(duration)
        if until is not None:
            deadline = time.monotonic() + limit - duration
            while not self.stop.is_set() and not until() and time.monotonic() < deadline:
                self.stop.wait(0.05)
        self.stop.set()
        for t in self.threads:
            t.join(60)
            assert not t.is_alive(), f"thread {t.name} hangs"
        assert not self.errors, "\n".join(self.errors)

    def run_to_completion(self, timeout=60):
        self.start()
        for t in self.threads:
            t.join(timeout)
            assert not t.is_alive(), f"thread {t.name} hangs"
        assert not self.errors, "\n".join(self.errors)
