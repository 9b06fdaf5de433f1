"""Where the scenarios' nodes run: the backends (local, container, vm, wine) and the
infrastructure their nodes are built from."""
