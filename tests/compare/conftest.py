from tests.peers.sshd import netns_lab  # noqa: F401  (fixture: sshd hosts in network namespaces)
