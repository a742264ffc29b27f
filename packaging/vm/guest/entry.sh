#!/bin/bash
# Payload entry point, run by pycell-vm-payload in the guest (see
# scripts/vm-image): the checks, with Python unbuffered so that each RESULT
# line reaches the serial console as it happens.
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 LANG=C.UTF-8
# For a guest that stalls below user space (scripts/vm-test's dump_stall):
# the kernel's text symbols, raw on the scratch disk (the guest boots with
# nokaslr, so they name the vCPUs' positions), and warnings and worse from
# the kernel (lockups, RCU stalls, hung tasks) on the console from here on.
if [[ -b /dev/vdc ]]; then
    grep ' [tT] ' /proc/kallsyms >/dev/vdc 2>/dev/null && sync
fi
dmesg --console-level warn 2>/dev/null || true
# multi-user.target is reached before this runs; boot "finishes" after it.
echo "PYCELL-VM-SYSTEMD multi-user.target reached after $(systemctl show -P ActiveEnterTimestampMonotonic multi-user.target | awk '{printf "%.1f s", $1 / 1e6}')"
exec /usr/bin/python3 /mnt/payload/checks.py
