"""The edge process must never load torch: a slow import or model step there would jitter pacing."""

import subprocess
import sys


def test_edge_modules_do_not_import_torch():
    code = (
        "import sys\n"
        "import cadenza, cadenza.cli, cadenza.edge.server.app\n"
        "import cadenza.ipc.edge_side.engine_client\n"
        "from cadenza.config import load_config\n"
        "cadenza.edge.server.app.create_app(load_config())\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "assert 'transformers' not in sys.modules, 'transformers was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_engine_is_importable_from_the_package():
    import cadenza

    assert cadenza.Engine.__name__ == "Engine"
    assert cadenza.__version__
