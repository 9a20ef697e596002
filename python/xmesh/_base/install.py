"""What an install of xmesh holds, said when its C++ module cannot be loaded."""
import os
import re
import sys
import sysconfig


def core_import_error(error: ImportError) -> str:
    """Why `xmesh._core` did not load, in the user's terms: a build for other Pythons (a wheel
    forced into an environment it was not made for), or its library's own loader error."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ours = "%d.%d" % sys.version_info[:2]
    built = sorted({f"{m.group(1)}.{m.group(2)}" for name in os.listdir(package)
                    if (m := re.match(r"_core\.cpython-(\d)(\d+)-", name))})
    if os.path.exists(os.path.join(package, "_core" + str(sysconfig.get_config_var("EXT_SUFFIX")))) or not built:
        return (f"xmesh's C++ module in {package} could not be loaded: {error}; reinstall xmesh in this "
                f"environment ({sys.executable})")
    return (f"this xmesh ({package}) was built for Python {', '.join(built)}, not for this Python {ours} "
            f"({sys.executable}): install xmesh built for Python {ours} in this environment")
