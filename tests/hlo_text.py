"""Hand-written HLO modules for the tests of `shardsearch.cost`."""

from shardsearch.cost.hlo import parse_collectives

ADD = """\
%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}
"""


def module(*lines, header="HloModule m, num_partitions=8", computations=""):
    """A module whose ENTRY holds parameter %p = f32[8,128] and then `lines`."""
    body = "\n".join(f"  {line}" for line in lines)
    text = f"{ADD}\n{computations}\n"
    text += "ENTRY %main (p: f32[8,128]) -> f32[8,128] {\n"
    text += f"  %p = f32[8,128]{{1,0}} parameter(0)\n{body}\n}}\n"
    return f"{header}\n\n{text}" if header else text


def only(text):
    collectives = parse_collectives(text).collectives
    assert len(collectives) == 1, collectives
    return collectives[0]
