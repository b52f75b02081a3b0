"""The processes a run starts outside Ray (sglang-router, SGLang's servers), found by their command lines with
psutil, independently of the code that starts them."""

import threading

import psutil

# in the router's command line: miles' launch (miles.rollout.router), then the title the router gives itself
ROUTER = ("sglang_router.launch_router", "sglang::router")
SGLANG_SERVER = ("miles::sglang_server",)  # the title of an SGLang server process (miles.rollout.sglang_server)


def processes_with(markers: tuple[str, ...], root: int | None = None) -> list[psutil.Process]:
    """The live processes whose command line contains one of ``markers`` (only ``root``'s descendants, if given)."""
    try:
        candidates = psutil.Process(root).children(recursive=True) if root else list(psutil.process_iter())
    except psutil.NoSuchProcess:
        return []
    found = []
    for proc in candidates:
        try:
            if any(marker in " ".join(proc.cmdline()) for marker in markers):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


class ProcessWatch:
    """The pids of every process of each kind (its markers) seen while the block runs (polled every 50 ms, 10 min at
    most)."""

    def __init__(self, *kinds: tuple[str, ...]) -> None:
        self.seen: dict[tuple[str, ...], set[int]] = {kind: set() for kind in kinds}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        for _ in range(12000):
            for kind, pids in self.seen.items():
                pids.update(proc.pid for proc in processes_with(kind))
            if self.done.wait(0.05):
                return

    def alive(self) -> list[int]:
        """The seen pids still running now."""
        return [pid for pids in self.seen.values() for pid in pids if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]

    def __enter__(self) -> "ProcessWatch":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join(timeout=10)
