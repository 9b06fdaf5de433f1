"""The VM backend's parts: the node's disks (`disk`), QEMU (`qemu`), one running VM
(`machine`), the host's ends of its virtio serial ports (`channel`) and the helper inside the
guest (`guest`, standard library only: it runs on the guest's own python3)."""
