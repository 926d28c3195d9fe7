import io

from retryfs.demo import run


def test_demo_shows_the_silent_loss_and_the_fix():
    out = io.StringIO()
    assert run(out=out) == 0
    text = out.getvalue()
    assert "3 failed commits of model.pt       pyarrow (plain)  success" in text
    assert "7/8 identical" in text  # the plain upload lost model.pt and said nothing
    assert text.count("8/8 identical") == 2  # retryfs, both scenarios
