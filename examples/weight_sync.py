"""Weight sync in the TorchStore style: a trainer publishes its parameters as one RDMA buffer,
generator actors on other procs pull them after each step. The handle travels in a call (a few
hundred bytes); the weights themselves move straight from the trainer's memory into each
generator's, on the generators' data threads: the trainer's actor is never asked for them."""
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from monarch.actor import Actor, endpoint, this_host
from monarch.rdma import RDMABuffer


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))


class Trainer(Actor):
    def __init__(self):
        torch.manual_seed(0)
        self.model = make_model()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)
        # The published weights: one flat tensor, lent once; each step copies into it.
        self.published = parameters_to_vector(self.model.parameters()).detach().clone()
        self.buffer = RDMABuffer(self.published)

    @endpoint
    def weights(self) -> RDMABuffer:
        return self.buffer

    @endpoint
    def step(self) -> float:
        x = torch.randn(64, 256)
        loss = (self.model(x) - x).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        with torch.no_grad():
            self.published.copy_(parameters_to_vector(self.model.parameters()))
        return float(self.published.double().sum())


class Generator(Actor):
    def __init__(self):
        torch.manual_seed(1)  # different weights until the first pull
        self.model = make_model()
        self.landing = torch.empty_like(parameters_to_vector(self.model.parameters()))

    @endpoint
    def pull(self, weights: RDMABuffer) -> float:
        weights.read_into(self.landing).get()
        vector_to_parameters(self.landing, self.model.parameters())
        return float(parameters_to_vector(self.model.parameters()).double().sum())


trainer = this_host().spawn_procs({"gpus": 1}).spawn("trainer", Trainer)
generators = this_host().spawn_procs({"gpus": 2}).spawn("generators", Generator)
weights = trainer.weights.call_one().get()
print(f"published {weights.size() // 4} parameters ({weights.size() >> 20} MiB) as one buffer")
for step in range(1, 4):
    trained = trainer.step.call_one().get()
    pulled = list(generators.pull.call(weights).get().values())
    print(f"step {step}: {len(pulled)} generators in sync with the trainer: {all(p == trained for p in pulled)}")
