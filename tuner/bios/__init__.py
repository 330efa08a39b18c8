"""BIOS settings through the BMC: Redfish (redfish.py, on sushy's connector) or the vendors' CLIs
(vendor.py). config.py reads which one a host uses from /etc/metaltune/bmc.yaml."""
