"""PCI configuration space: decoding (config.py) and the sysfs view of devices (sysfs.py)."""
