"""Command palette entries (ctrl+p): go to a screen, open a spec, launch, mlflow ui."""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from dstui.core.paths import CONFIGS_DIR


class DstuiCommands(Provider):
    def _commands(self) -> list[tuple[str, str, object]]:
        app = self.app
        cmds: list[tuple[str, str, object]] = [
            ("Go to Compose", "edit an experiment spec", partial(app.action_goto, "compose")),
            ("Go to Runs", "batches and runs; launch, cancel, retry", partial(app.action_goto, "runs")),
            ("Go to Results", "compare finished runs from MLflow", partial(app.action_goto, "results")),
            ("Launch current spec", "validate and launch the composed/opened spec", app.launch_current),
            ("Tune current spec", "find the fastest configuration of its tune: space (dstui tune)", app.tune_current),
            ("Help", "keys of this screen", app.action_help),
            ("Bell on failures: on/off", "ring the terminal bell when a run fails, hangs or is flagged", app.toggle_bell),
        ]
        for f in sorted((CONFIGS_DIR / "experiments").glob("*.yaml")):
            cmds.append((f"Open spec {f.name}", str(f), partial(app.open_spec, f)))
        return cmds  # type: ignore[return-value]

    async def discover(self) -> Hits:
        for name, help_text, cb in self._commands():
            yield DiscoveryHit(name, cb, help=help_text)  # type: ignore[arg-type]

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, help_text, cb in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), cb, help=help_text)  # type: ignore[arg-type]
