"""Commands run in processes side by side: most of a short command's time is
importing jax, which two cores do for several processes at once."""

import subprocess


def run_side_by_side(commands, cwd, env, timeout=120):
    """`{name: argv}` → `{name: CompletedProcess}`, every command started
    before any is waited for; a command still running when one fails to
    finish in `timeout` seconds is killed."""
    procs = {}
    try:
        for name, argv in commands.items():
            procs[name] = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True)
        done = {}
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=timeout)
            done[name] = subprocess.CompletedProcess(commands[name], proc.returncode, out, err)
        return done
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
