"""lockserver: a standalone in-memory lock server in the style of Azos Sky locking.

Run it with the ``lockserver`` command (``python -m lockserver``), or embed it in a trio
program: ``running = await nursery.start(serve, ServerConfig(port=0))``.
"""

from ._config import ConfigError as ConfigError
from ._config import ServerConfig as ServerConfig
from ._config import load_config as load_config
from ._trust import TrustSettings as TrustSettings
from .shell import RunningServer as RunningServer
from .shell import serve as serve

__all__ = ["serve", "RunningServer", "ServerConfig", "TrustSettings", "load_config", "ConfigError"]
