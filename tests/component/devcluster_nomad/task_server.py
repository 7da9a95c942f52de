"""A tiny task for the Nomad stand-in's tests: records its pid and env, serves HTTP, may exit early.

argv: PORT [EXIT_AFTER_SECONDS EXIT_CODE]
"""

import http.server
import json
import os
import sys
import threading
import time


def main() -> None:
    port = int(sys.argv[1])
    task_dir = os.environ.get("NOMAD_TASK_DIR", ".")
    with open(os.path.join(task_dir, "pid"), "w") as f:
        f.write(str(os.getpid()))
    with open(os.path.join(task_dir, "env.json"), "w") as f:
        json.dump(dict(os.environ), f)
    print(f"task {os.environ.get('NOMAD_TASK_NAME')} listening on {port}", flush=True)
    if len(sys.argv) > 3:
        delay, code = float(sys.argv[2]), int(sys.argv[3])
        time.sleep(delay)  # a task that runs this long, then exits: what the test asks for
        print(f"exiting with {code}", flush=True)
        sys.exit(code)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"alloc": os.environ.get("NOMAD_ALLOC_ID")}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    while True:
        time.sleep(3600)  # serve until killed


if __name__ == "__main__":
    main()
