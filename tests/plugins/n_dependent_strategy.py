"""A user strategy with a bug des.check must catch: its first FC slices are drawn with a seed that
depends on the number of ranks (what "randomness never depends on N" forbids)."""

from des.strategies import register_strategy
from des.strategies.components import DenseParams
from des.strategies.des import DES
from des.strategies.forms import ModelSplitForm


class RankCountSeededDES(DES):
    name = "des_seeded_by_n"
    description = "DES whose dense weights are drawn with seed + N (wrong on purpose)"

    def __init__(self, context) -> None:
        super().__init__(context)
        self.dense = DenseParams(self.model, self.shard.fields, context.optimizers, seed=self.seed + self.comm.size,
                                 dtype=self.dtype)
        self.split_form = ModelSplitForm(self.model, self.dense, self.dtype)
        self.step = self.build_step()  # the stages over these weights


register_strategy(RankCountSeededDES)
