"""Sample each thread's CPU ticks of the dyncomplete processes (server and replay client) every 2 s,
one JSON line a sample, until killed: python cpu_sample.py LOG"""
import os, time, json, sys
out = open(sys.argv[1], "w")
def snap():
    res = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit(): continue
        try:
            cmd = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
        except OSError: continue
        if "dyncomplete" not in cmd or "cpu_sample" in cmd: continue
        role = "server" if " serve" in cmd else "client"
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                st = open(f"/proc/{pid}/task/{tid}/stat").read()
                name = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            except OSError: continue
            f = st.rsplit(")", 1)[1].split()
            res[f"{role}:{pid}:{tid}:{name}"] = int(f[11]) + int(f[12])
    return res
prev = snap()
while True:
    time.sleep(2)
    cur = snap()
    out.write(json.dumps({k: cur[k] - prev.get(k, 0) for k in cur if cur[k] - prev.get(k, 0) > 0}) + "\n"); out.flush()
    prev = cur
