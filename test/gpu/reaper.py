"""Runs a command in a new session under a subreaper that reaps whatever is orphaned below it.

Usage: HERR=FILE python3 reaper.py CMD... (the command's stderr goes to FILE). CRIU kills a
checkpointed tree's children with it, and the GPU machine's PID 1 reaps orphans slowly: a
zombie left there holds its PID, which a restore needs.
"""
import ctypes, os, subprocess, sys, time

ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                 stderr=open(os.environ["HERR"], "w"), start_new_session=True)
while True:
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        time.sleep(0.1)
