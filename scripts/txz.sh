# shellcheck shell=bash
# Sourced by the scripts that build what a device run carries (64 MiB at most in all).
# txz DIR FILE: DIR's contents as FILE, tar compressed with xz -9 on every core.
txz() { tar -C "$1" -cf - . | xz -T0 -9 > "$2"; }
