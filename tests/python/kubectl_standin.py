"""A stand-in for `kubectl port-forward` (no cluster, so no kubectl, exists here): it takes the
arguments kubectl takes (`port-forward --namespace NS pod/NAME :PORT [--kubeconfig FILE]`), asks
the API server of the kubeconfig for that pod (as kubectl does) and forwards a loopback port of its
own to the pod's IP and port, printing kubectl's first lines ("Forwarding from 127.0.0.1:N ->
PORT") until SIGTERM. Its arguments are appended to
$KUBECTL_STANDIN_LOG."""
import json
import os
import signal
import sys
import urllib.request

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_tcp_links import Relay  # noqa: E402


def main(argv: list) -> int:
    with open(os.environ["KUBECTL_STANDIN_LOG"], "a") as f:
        f.write(json.dumps(argv) + "\n")
    if not argv or argv[0] != "port-forward":
        print(f"error: the stand-in does only port-forward, not {argv[:1]}", file=sys.stderr)
        return 1
    args = argv[1:]
    namespace = args[args.index("--namespace") + 1]
    kubeconfig = args[args.index("--kubeconfig") + 1] if "--kubeconfig" in args else os.path.expanduser("~/.kube/config")
    pod = next(a for a in args if a.startswith("pod/"))[len("pod/"):]
    port = int(next(a for a in args if a.startswith(":"))[1:])
    config = yaml.safe_load(open(kubeconfig))
    server = config["clusters"][0]["cluster"]["server"]
    token = config["users"][0]["user"]["token"]
    request = urllib.request.Request(f"{server}/api/v1/namespaces/{namespace}/pods/{pod}",
                                     headers={"Authorization": f"Bearer {token}"})
    try:
        ip = json.load(urllib.request.urlopen(request, timeout=10))["status"]["podIP"]
    except Exception as e:
        print(f'error: pods "{pod}" not found ({e})', file=sys.stderr)
        return 1
    relay = Relay(port, target_host=ip)
    print(f"Forwarding from 127.0.0.1:{relay.port} -> {port}", flush=True)
    print(f"Forwarding from [::1]:{relay.port} -> {port}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    return 0


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    sys.exit(main(sys.argv[1:]))
