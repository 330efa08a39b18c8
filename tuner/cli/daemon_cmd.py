"""`metaltune daemon`, `metaltune install [--root DIR]`, `metaltune uninstall [--root DIR]`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("daemon")
    def daemon(
        ctx: typer.Context,
        config: Optional[Path] = typer.Option(
            None, "--config", envvar="METALTUNE_CONFIG",
            help="Daemon configuration (TOML). Default /etc/metaltune/config.toml.",
        ),
        check: bool = typer.Option(False, "--check", help="Validate the configuration (and the installed "
                                   "unit: can it run this config?) and exit."),
        root: Optional[Path] = typer.Option(
            None, "--root", help="With --check: check what `install --root DIR` wrote (config and unit)."),
    ) -> None:
        """Run the metaltune service (systemd Type=notify): recover, re-apply the active profile,
        watch health, serve the control socket, run searches when allowed."""
        from tuner.daemon import check as dcheck, config as dconfig
        from tuner.daemon.install import CONFIG, UNIT_DIR, UNIT_NAME
        from tuner.errors import BadInput

        if root is not None and not check:
            raise BadInput("--root: goes with --check (the daemon runs from the system's own config)")
        if root is not None:
            from tuner.daemon.install import root_dir

            root_dir(root)
        path = root / CONFIG if root is not None and config is None else dconfig.config_path(config)
        cfg = dconfig.load(path)
        if root is not None:
            cfg = dcheck.under_root(cfg, root)
        dcheck.references(cfg, path)  # also before a start: a config that passes --check starts
        if check:
            unit = (root or Path("/")) / UNIT_DIR / UNIT_NAME
            if (root is not None or path == dconfig.DEFAULT_PATH) and unit.is_file():
                dcheck.unit_serves(cfg, unit, root or Path("/"))
                typer.echo(f"{path}: ok ({unit} can run it)")
            else:
                typer.echo(f"{path}: ok")
            return
        from tuner.daemon.service import run

        code = run(cfg, path)
        if code:
            raise typer.Exit(code)

    @app.command("install")
    def install_cmd(
        root: Path = typer.Option(Path("/"), "--root", help="Install into this folder (tests, packaging)."),
        exec_path: Optional[str] = typer.Option(
            None, "--exec", help="Absolute path of the metaltune executable for ExecStart."),
        allow_ip: List[str] = typer.Option(
            [], "--allow-ip", help="Address the service may reach (e.g. a BMC); repeatable."),
        backend: str = typer.Option("real", "--backend", help="backend written into a new config."),
        sim_root: Optional[Path] = typer.Option(None, "--sim-root", help="sim_root for a new config."),
        force: bool = typer.Option(False, "--force", help="Overwrite an existing config and policy."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Install the systemd unit, /etc/metaltune/config.toml, the default policy and the state dir."""
        from tuner.daemon.install import install

        res = install(root, exec_start=[exec_path] if exec_path else None, allow_ip=allow_ip,
                      force=force, backend=backend, sim_root=sim_root)
        if as_json:
            typer.echo(json.dumps(res, indent=2))
            return
        for p in res["written"]:
            typer.echo(f"wrote  {p}")
        for p in res["kept"]:
            typer.echo(f"kept   {p} (exists; --force overwrites)")
        for b in res["bound_read_only"]:
            typer.echo(f"bind   {b} read-only into the service (ProtectHome/PrivateTmp hide it)")
        for n in res["notes"]:
            typer.echo(f"note: {n}")
        if not res["policy_installed"]:
            typer.echo("note: no default policy shipped in this build; write /etc/metaltune/policy.yaml")
        typer.echo(f"next: {res['next']}")

    @app.command("uninstall")
    def uninstall_cmd(
        root: Path = typer.Option(Path("/"), "--root", help="Folder given to `install --root`."),
        purge: bool = typer.Option(False, "--purge", help="Also remove config, policy, journal and trials."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Remove the unit (and with --purge the configuration and state). Stop the service first:
        `systemctl disable --now metaltune` (its stop policy decides what stays applied)."""
        from tuner.daemon.install import uninstall

        res = uninstall(root, purge=purge)
        if as_json:
            typer.echo(json.dumps(res, indent=2))
            return
        for p in res["removed"]:
            typer.echo(f"removed {p}")
        for p in res["kept"]:
            typer.echo(f"kept    {p} (--purge removes)")
