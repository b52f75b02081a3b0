"""A local tool for multi-turn generate functions: ``POST /run {"query": text}`` answers ``{"result": RESULT}`` and
counts the queries. uvicorn on a thread of the test process, on 127.0.0.1 and a free port, stopped on exit."""

import socket
import threading
import time

import uvicorn
from fastapi import FastAPI

RESULT = "+1="  # in the embedded model's vocabulary (digits, + and =)


class ToolServer:
    def __init__(self) -> None:
        self.queries: list[str] = []
        self.lock = threading.Lock()
        app = FastAPI()

        @app.post("/run")
        async def run(body: dict):
            with self.lock:
                self.queries.append(body["query"])
            return {"result": RESULT}

        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}/run"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    def __enter__(self) -> "ToolServer":
        self.thread.start()
        for _ in range(200):  # 10 s at most
            if self.server.started:
                return self
            time.sleep(0.05)
        raise RuntimeError("the tool server did not start")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.socket.close()
