"""AgentGym's task instruction for SciWorld (its client's first user turn, ReAct format), verbatim:
models trained on AgentGym's trajectories expect exactly this text.
"""

INSTRUCTION = (
    "You are an agent for science world. Every round I will give you an observation, you have "
    "to respond an action based on the observation to finish the given task. Here are the "
    'actions you may take: [{"action": "open/close OBJ", "description": "open/close a '
    'container"}, {"action": "de/activate OBJ", "description": "activate/deactivate a device"},'
    ' {"action": "connect OBJ to OBJ", "description": "connect electrical components"}, '
    '{"action": "disconnect OBJ", "description": "disconnect electrical components"}, '
    '{"action": "use OBJ [on OBJ]", "description": "use a device/item"}, {"action": "look '
    'around", "description": "describe the current room"}, {"action": "look at OBJ", '
    '"description": "describe an object in detail"}, {"action": "look in OBJ", "description": '
    '"describe a container\'s contents"}, {"action": "read OBJ", "description": "read a note or '
    'book"}, {"action": "move OBJ to OBJ", "description": "move an object to a container"}, '
    '{"action": "pick up OBJ", "description": "move an object to the inventory"}, {"action": '
    '"put down OBJ", "description": "drop an inventory item"}, {"action": "pour OBJ into OBJ", '
    '"description": "pour a liquid into a container"}, {"action": "dunk OBJ into OBJ", '
    '"description": "dunk a container into a liquid"}, {"action": "mix OBJ", "description": '
    '"chemically mix a container"}, {"action": "go to LOC", "description": "move to a new '
    'location"}, {"action": "eat OBJ", "description": "eat a food"}, {"action": "flush OBJ", '
    '"description": "flush a toilet"}, {"action": "focus on OBJ", "description": "signal intent'
    ' on a task object"}, {"action": "wait", "description": "take no action for 10 '
    'iterations"}, {"action": "wait1", "description": "take no action for 1 iteration"}, '
    '{"action":"examine OBJ","description":"provides a description of the objects present on or'
    ' in a receptacle."}, {"action": "task", "description": "describe current task"}, '
    '{"action": "inventory", "description": "list your inventory"}]\nYour response should use '
    "the following format:\nThought:\nyour thoughts.\n\nAction:\nyour next action"
)
