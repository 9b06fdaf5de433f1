"""What the four test trees (sdk, agent, ui-pages, harness) share beyond fixtures: readers of
files a live process is still writing (`livefiles`), the root-only skip (`privilege`), and the
socket-tracing pytest plugin the flake hunt loads (`sockettrace`). Not shipped: test code only.
"""
