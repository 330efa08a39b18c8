#!/usr/bin/env python3
"""Ansible dynamic inventory from a metaltune fleet inventory (one file for both tools).

    METALTUNE_INVENTORY=fleet.yaml ansible-playbook -i deploy/ansible/metaltune_inventory.py \
        deploy/ansible/rollout.yml -e profile=h200

Host keys: leave Ansible's host_key_checking on (the default), as metaltune fleet does.
"""
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # a source checkout


def main() -> int:
    from tuner.errors import BadInput
    from tuner.fleet.inventory import load, to_ansible

    path = os.environ.get("METALTUNE_INVENTORY")
    if not path:
        print("metaltune_inventory.py: set METALTUNE_INVENTORY to the fleet inventory YAML", file=sys.stderr)
        return 2
    try:
        inv = load(Path(path))
    except BadInput as e:
        print(f"metaltune_inventory.py: {e}", file=sys.stderr)
        return 2
    doc = to_ansible(inv)
    if len(sys.argv) > 2 and sys.argv[1] == "--host":
        print(json.dumps(doc["_meta"]["hostvars"].get(sys.argv[2], {})))
    else:
        print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
