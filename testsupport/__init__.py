"""What the four test trees (sdk, agent, ui-pages, harness) share beyond fixtures: readers of
files a live process is still writing (`livefiles`), the root-only skip (`privilege`), an
agent's heartbeat sender run until a portal answered it (`senders`), and the socket-tracing
pytest plugin the flake hunt loads (`sockettrace`). Not shipped: test code only.
"""
