"""A missing optional package is one line naming the extra to install, said before a run writes anything."""

import io

import pytest
from rich.console import Console

import tandemrl.extras as extras
from tandemrl.cli import main
from tandemrl.config import load_config
from tandemrl.extras import MissingExtraError, check_run_extras, require_extra
from tandemrl.train.loop import train


def run_extras(cfg):
    return check_run_extras(cfg.log.tensorboard, cfg.log.wandb_project, cfg.model.lora.enabled)


def without(monkeypatch, *packages: str) -> None:
    monkeypatch.setattr(extras, "installed", lambda package: package not in packages)


def test_require_extra_names_the_setting_and_the_extra():
    require_extra("json", "nothing", "never raised")  # installed: silent
    with pytest.raises(MissingExtraError) as err:
        require_extra("no_such_package_tandemrl", "data", "data.path = 'org/name' is a hub dataset id")
    assert str(err.value) == ("data.path = 'org/name' is a hub dataset id but no_such_package_tandemrl is not "
                              "installed: pip install 'tandemrl[data]'")
    assert isinstance(err.value, ValueError)  # the CLI prints ValueErrors as one line and exits 2


def test_installed_survives_a_missing_parent_package():
    assert not extras.installed("no_such_package_tandemrl.sub")
    assert extras.installed("json")


@pytest.mark.parametrize(("overrides", "package", "message"), [
    (["log.wandb_project=demo"], "wandb", "log.wandb_project = 'demo' is set but wandb is not installed: "
                                          "pip install 'tandemrl[wandb]'"),
    (["model.lora.enabled=true"], "peft", "model.lora.enabled = true but peft is not installed: "
                                          "pip install 'tandemrl[lora]'"),
    (["log.tensorboard=true"], "tensorboard", "log.tensorboard = true but tensorboard is not installed: "
                                              "pip install 'tandemrl[tensorboard]'"),
])
def test_each_missing_package_stops_the_run(monkeypatch, overrides, package, message):
    without(monkeypatch, package)
    with pytest.raises(MissingExtraError) as err:
        run_extras(load_config(None, overrides))
    assert str(err.value) == message


def test_unset_tensorboard_without_the_package_says_so_and_goes_on(monkeypatch):
    without(monkeypatch, "tensorboard")
    notes = run_extras(load_config(None, []))
    assert len(notes) == 1 and "pip install 'tandemrl[tensorboard]'" in notes[0]
    assert run_extras(load_config(None, ["log.tensorboard=false"])) == []
    without(monkeypatch)
    assert run_extras(load_config(None, [])) == []


def test_nothing_is_written_before_the_error(monkeypatch, tmp_path):
    without(monkeypatch, "wandb")
    cfg = load_config(None, [f'model.tiny_dir="{tmp_path / "tiny"}"', "model.device=cpu", "log.wandb_project=demo"])
    with pytest.raises(MissingExtraError):
        train(cfg, tmp_path / "run", console=Console(file=io.StringIO()))
    assert not (tmp_path / "run").exists() and not (tmp_path / "tiny").exists()


def test_cli_prints_one_line_and_exits_2(monkeypatch, tmp_path, capsys):
    without(monkeypatch, "peft")
    code = main(["train", "--set", "model.lora.enabled=true", "--set", f'model.tiny_dir="{tmp_path / "tiny"}"',
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and err == ("error: model.lora.enabled = true but peft is not installed: "
                                 "pip install 'tandemrl[lora]'\n")
    assert not (tmp_path / "run").exists()
