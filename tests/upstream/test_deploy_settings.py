"""The engine settings of docs/deploy.md, read by upstream LMCache's own
code (tests/upstream/README.md): SGLang's LMCache file through upstream's
configuration loader, the vLLM connector's host and port as its
connector joins them, and upstream's own client reaching a running
lmcached at the address each gives.  vLLM and SGLang are not installed
here; docs/deploy.md, "How this page is tested"."""
import os
import sys

import yaml
import zmq

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests", "packaging"))
from deploy_doc import one_node_server, sglang_file, vllm_config  # noqa: E402


def at_port(url, doc_port, port):
    """The page's address with the page's port replaced by the running
    server's free one (as the page's own test replaces it)."""
    assert url.endswith(f":{doc_port}"), url
    return url[:-len(str(doc_port))] + str(port)


def noop(url):
    from lmcache.v1.multiprocess.transport.factory import RequestClientFactory
    c = RequestClientFactory.create(url, context=zmq.Context.instance())
    try:
        return c.noop().result(timeout=10)
    finally:
        c.close()


def test_vllm_and_sglang_settings_reach_lmcached(lmcached, upstream, tmp_path):
    host, doc_port = one_node_server()
    srv = lmcached("--host", host)

    # vLLM's LMCacheMPConnector: "{lmcache.mp.host}:{lmcache.mp.port}".
    extra = vllm_config()["kv_connector_extra_config"]
    url = f"{extra['lmcache.mp.host']}:{extra['lmcache.mp.port']}"
    assert noop(at_port(url, doc_port, srv.port)) == "OK"

    # SGLang: the file, read by upstream's loader; a host without a scheme
    # is tcp:// (upstream's unified SGLang connector).
    from lmcache.v1.config import load_engine_config_with_overrides
    _, text = sglang_file()
    cfg = yaml.safe_load(text)
    cfg["mp_port"] = srv.port
    path = tmp_path / "sglang.yaml"
    path.write_text(yaml.safe_dump(cfg))
    loaded = load_engine_config_with_overrides(config_file_path=str(path))
    assert (loaded.mp_host, loaded.mp_port) == (host, srv.port)
    scheme = "" if "://" in loaded.mp_host else "tcp://"
    assert noop(f"{scheme}{loaded.mp_host}:{loaded.mp_port}") == "OK"
