"""What the Linux and macOS backends share: process groups (sessions and ``killpg``), the
control socket, the state-dir lock, stop and reload as signals, descriptor streams."""
