"""Boot-time settings tried by a one-shot boot (docs/boot-trials.md).

`cmdline` reads and edits kernel command lines; `grub` and `bls` are the two boot loaders (a
one-shot entry, its promotion to the default, its demotion); `loader` picks the host's; `commands`
runs or, in a dry run, only lists what a loader does; `trial` arms a candidate before the reboot
and `gate` decides it after, from the journal (safety.boot_journal)."""
