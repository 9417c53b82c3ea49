"""Loaded by every Python process of the SGLang test (tests/py/sglang_site on PYTHONPATH): SGLang's
scheduler and TP workers are processes of their own, and this is how the test sees inside them.

With TPFS_SGLANG_KEYS=DIR set, it wraps SGLang's two loaders (srt/model_loader/loader.py
DefaultModelLoader.load_model and ShardedStateLoader.load_model) so that each TP worker writes
DIR/<load format>-rank<R>.json when its model is loaded:
  "expected": {key: [shape, dtype]} of ShardedStateLoader._filter_subtensors(model.state_dict()),
              the keys and shapes sharded_state fills (recorded as it asks for them; default loader:
              the same call made on its model, so the two can be compared);
  "final":    {name: "shape dtype sha1"} of every parameter and buffer (non-persistent ones too) and every tensor a module
              holds as a plain attribute, after each loader's post-load steps (SGLang processes
              the weights, then post_load_weights, inside load_model).
The loaders themselves are SGLang's, unchanged. Without the variable this module does nothing at start;
install() installs the hooks in a process that then forks SGLang's processes (sglang_check.py), and the
folder is read when a record is written (the job's, set before its Engine starts).
"""
import os

_installed = []


def install():
    """Wraps the two loaders, once per process (a forked child keeps its parent's wrappers)."""
    if _installed:
        return
    _installed.append(True)
    import hashlib
    import json

    import torch
    from sglang.srt.model_loader import loader as L

    def digest(t):
        t = t.detach().contiguous().cpu()
        # reshape(-1): a 0-d tensor (Apertus's xIELU beta and eps) cannot be viewed as bytes of another size
        b = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return "%s %s %s" % (tuple(t.shape), str(t.dtype).replace("torch.", ""), hashlib.sha1(b).hexdigest())

    def tensors(model):
        out = {}
        for n, t in model.state_dict(keep_vars=True).items():
            out[n] = digest(t)
        for n, t in model.named_buffers():  # non-persistent buffers too (not in the state dict)
            out.setdefault(n, digest(t))
        for mn, m in model.named_modules():
            for a, v in vars(m).items():
                if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter):
                    out.setdefault((mn + "." if mn else "") + a, digest(v))
        return out

    expected = {}
    filt = L.ShardedStateLoader._filter_subtensors

    def filter_subtensors(ts):
        r = filt(ts)
        expected.clear()
        expected.update({k: [list(t.shape), str(t.dtype).replace("torch.", "")] for k, t in r.items()})
        return r
    L.ShardedStateLoader._filter_subtensors = staticmethod(filter_subtensors)

    def wrap(cls, how):
        orig = cls.load_model

        def load_model(self, *a, **k):
            model = orig(self, *a, **k)
            from sglang.srt.runtime_context import get_parallel
            rank = get_parallel().tp_rank
            if how != "sharded_state":
                L.ShardedStateLoader._filter_subtensors(model.state_dict())
            d = os.environ["TPFS_SGLANG_KEYS"]
            with open(os.path.join(d, "%s-rank%d.json" % (how, rank)), "w") as f:
                json.dump({"expected": dict(expected), "final": tensors(model)}, f)
            return model
        cls.load_model = load_model
    wrap(L.DefaultModelLoader, "auto")
    wrap(L.ShardedStateLoader, "sharded_state")


try:
    if os.environ.get("TPFS_SGLANG_KEYS"):
        install()
except ImportError:  # not the SGLang venv: nothing to wrap
    pass
