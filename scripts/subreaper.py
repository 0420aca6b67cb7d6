"""Runs a command as the subreaper of everything below it and exits with its status.

Usage: python3 subreaper.py CMD... Restored trees are orphans of their restore, and the GPU
machine's PID 1 reaps orphans slowly: a zombie left there holds the PID the next restore of
the same image needs. A script re-runs itself under this so that they are reaped at once.
"""
import ctypes, os, subprocess, sys

ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
cmd = subprocess.Popen(sys.argv[1:])
while True:
    pid, status = os.waitpid(-1, 0)
    if pid == cmd.pid:
        sys.exit(os.waitstatus_to_exitcode(status))
